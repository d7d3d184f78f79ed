"""The documentation against the code: docs/config.md lists exactly the config schema's keys with
their defaults (so a key added, renamed or re-defaulted without its row fails here), every
relative link in the README and docs/ resolves, the README stays a front page, and no file names
the design documents the project was built from instead of the concept or the tool."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from shardwise.train.config import schema_keys

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ROW = re.compile(r"^\| `([a-z0-9_.]+)` \| `([^`]*)` \| (.+) \|$")


def _render(default) -> str:
    if default is None:
        return "null"
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


def _documented() -> dict[str, str]:
    rows = {}
    for line in (DOCS / "config.md").read_text().splitlines():
        match = ROW.match(line)
        if match:
            key, default, _ = match.groups()
            assert key not in rows, f"docs/config.md documents {key} twice"
            rows[key] = default
    return rows


def test_every_config_key_is_documented_once_with_its_default():
    documented, schema = _documented(), schema_keys()
    assert sorted(set(schema) - set(documented)) == [], "keys missing from docs/config.md"
    assert sorted(set(documented) - set(schema)) == [], "docs/config.md keys the schema lacks"
    wrong = {
        k: (documented[k], _render(v)) for k, v in schema.items() if documented[k] != _render(v)
    }
    assert wrong == {}, "documented default != schema default"


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "csrc" / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert broken == []


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move reference text to docs/"
    assert "make demo" in "\n".join(lines) and "make test" in "\n".join(lines)


def test_no_file_names_the_design_documents():
    pattern = re.compile("seed" + r"[ _-]?00\d|" + "shared/" + "seeds", re.IGNORECASE)
    suffixes = {".py", ".md", ".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".yaml", ".sh", ".txt"}
    found = []
    for folder in (
        "python/shardwise",
        "csrc",
        "tests",
        "docs",
        "examples",
        "scripts",
        "benchmarks",
    ):
        for path in (ROOT / folder).rglob("*"):
            skip = {"results", "include", "egg-info"} & set(path.parts)  # outputs, build copies
            if path.suffix in suffixes and not skip and path.is_file():
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if pattern.search(line):
                        found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    found += [f"README.md: {m}" for m in pattern.findall((ROOT / "README.md").read_text())]
    assert found == []
