"""scripts/check_structure.py, the house rules ``make lint`` checks beyond formatting: each rule
against a small tree that breaks it, and the repository itself."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_structure.py"


@pytest.fixture
def check(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("check_structure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "PACKAGE", tmp_path / "python" / "shardwise")
    monkeypatch.setattr(module, "LONG_FILES", {})
    monkeypatch.setattr(module, "KNOWN_CYCLES", [])
    return module


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_the_repository_keeps_the_rules():
    spec = importlib.util.spec_from_file_location("check_structure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main() == 0


def test_a_file_over_600_lines_is_refused_and_a_ratchet_may_only_shrink(check, tmp_path):
    long = write(tmp_path, "csrc/a.cc", "x\n" * 601)
    short = write(tmp_path, "csrc/b.cc", "x\n" * 600)
    assert [e.split(":")[0] for e in check.long_files([long, short])] == ["csrc/a.cc"]
    check.LONG_FILES["csrc/a.cc"] = 601
    assert check.long_files([long]) == []
    check.LONG_FILES["csrc/a.cc"] = 650
    write(tmp_path, "csrc/a.cc", "x\n" * 651)
    assert "may only shrink" in check.long_files([long])[0]
    write(tmp_path, "csrc/a.cc", "x\n" * 500)  # fixed: its ratchet entry must go
    assert "remove its entry" in check.long_files([long])[0]


def test_an_import_cycle_is_found_even_through_a_lazy_import(check, tmp_path):
    write(tmp_path, "python/shardwise/__init__.py", "from . import a\n")
    write(tmp_path, "python/shardwise/a.py", "from . import b\n")
    write(tmp_path, "python/shardwise/b.py", "def f():\n    from .a import g\n")
    write(tmp_path, "python/shardwise/c.py", "from . import a\nfrom .. import shardwise\n")
    assert check.import_cycles() == [{"shardwise.a", "shardwise.b"}]
    assert "shardwise.a, shardwise.b" in check.cycle_errors()[0]
    check.KNOWN_CYCLES.append({"shardwise.a", "shardwise.b", "shardwise.c"})
    assert check.cycle_errors() == []


def test_a_read_of_fsdp_private_state_outside_fsdp_is_refused(check, tmp_path):
    write(tmp_path, "python/shardwise/fsdp/module.py", "class F:\n    def __init__(s):\n"
          "        self._engine = 1\n")  # fmt: skip
    reader = write(
        tmp_path,
        "python/shardwise/zero/engine.py",
        "def f(fsdp):\n    self._engine = 2\n    return fsdp._engine\n",
    )
    errors = check.private_read_errors([reader])
    assert len(errors) == 1 and errors[0].startswith("python/shardwise/zero/engine.py:3:")


def test_a_library_module_importing_the_trainer_is_refused(check, tmp_path):
    write(tmp_path, "python/shardwise/train/checkpoint.py", "")
    write(tmp_path, "python/shardwise/train/__init__.py", "")
    write(
        tmp_path,
        "python/shardwise/zero/engine.py",
        "def f():\n    from ..train import checkpoint\n",
    )
    write(tmp_path, "python/shardwise/deepspeed.py", "from .train import checkpoint\n")
    errors = check.layering_errors()
    assert len(errors) == 1 and errors[0].startswith(
        "shardwise.zero.engine imports shardwise.train.checkpoint"
    )
