"""PyTorch's own distributed test suite against the shardwise backend and gloo (issue 18):
gates the installed wheel's suite (``gate.py``), runs its CPU tests at ``--world`` ranks for
each backend (``test_torch_suite.py``, one pytest per backend, results as JUnit XML), and
compares: every test that passes on gloo must pass on shardwise, or be listed with its reason in
``known_differences.txt``. Writes ``report.md`` to ``--out`` and exits 1 on an unexplained
failure (or when nothing ran).

Run: python tests/conformance/run.py --out build/conformance            # all CPU tests, world 2
     python tests/conformance/run.py --out build/conformance --subset ci  # the CI sample
     python tests/conformance/run.py --out build/conformance --world 8 \
         --decorated skip_if_small_worldsize     # the tests torch runs only at 8 ranks
     python tests/conformance/run.py --out build/conformance-hosts --subset ci --world 4 \
         --hosts 2    # shardwise's ranks as if on 2 hosts (TCP between them, hierarchical
                      # collectives); gloo's as they are
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLASS = "TestDistBackendWithSpawn"


def listed(path: Path) -> dict[str, str]:
    """name -> the rest of the line (a reason), from a file of ``name  # reason`` lines."""
    entries = {}
    for line in path.read_text().splitlines():
        name, _, reason = line.partition("#")
        if name.strip():
            entries[name.strip()] = reason.strip()
    return entries


def outcomes(xml: Path) -> dict[str, str]:
    """test name -> passed | failed | skipped, from a JUnit XML file."""
    result = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        state = "failed" if kinds & {"failure", "error"} else "passed"
        result[case.get("name")] = "skipped" if "skipped" in kinds else state
    return result


def decorated(gated: Path, decorator: str) -> list[str]:
    """The suite's test methods carrying ``@decorator`` (read from the gated copy of the installed
    wheel's file, so the selection follows the torch version)."""
    names = set()
    for node in ast.walk(ast.parse((gated / "shardwise_distributed_test.py").read_text())):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            marks = {ast.unparse(d).split("(")[0].split(".")[-1] for d in node.decorator_list}
            if decorator in marks:
                names.add(node.name)
    return sorted(names)


def chosen_tests(args, gated: Path) -> list[str]:
    """The test names --subset or --decorated picks; empty for every test."""
    if args.subset:
        return sorted(listed(HERE / f"{args.subset}_subset.txt"))
    if args.decorated:
        names = decorated(gated, args.decorated)
        if not names:
            raise SystemExit(f"--decorated {args.decorated}: no test of the suite carries it")
        return names
    return []


def run_backend(backend: str, args, gated: Path) -> tuple[dict[str, str], float]:
    xml = args.out / f"{backend}-world{args.world}.xml"
    env = dict(
        os.environ,
        BACKEND=backend,
        WORLD_SIZE=str(args.world),
        SHARDWISE_GATED_DIR=str(gated),
        OMP_NUM_THREADS="1",
    )
    if backend == "shardwise" and args.hosts:
        env["SHARDWISE_CONFORMANCE_HOSTS"] = str(args.hosts)
    suite = str(HERE / "test_torch_suite.py")
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x" if args.stop else "",
        f"--junitxml={xml}", "-o", "junit_family=xunit1",
    ]  # fmt: skip
    command = [c for c in command if c]
    names = chosen_tests(args, gated)
    if names:  # exact test ids (-k would also match every name they begin)
        command += [f"{suite}::{CLASS}::{name}" for name in names]
    else:
        command += [suite] + (["-k", args.k] if args.k else [])
    start = time.monotonic()
    subprocess.run(command, env=env, cwd=HERE, check=False)
    return outcomes(xml), time.monotonic() - start


def compare(gloo: dict, ours: dict, known: dict) -> tuple[list, list, list]:
    """(unexplained, explained, newly passing) test names."""
    unexplained, explained = [], []
    for name, state in sorted(gloo.items()):
        if state == "passed" and ours.get(name) != "passed":
            (explained if name in known else unexplained).append(name)
    extra = [n for n, s in sorted(ours.items()) if s == "passed" and gloo.get(n) != "passed"]
    return unexplained, explained, extra


def report(args, gloo, ours, times, known) -> tuple[list[str], bool]:
    unexplained, explained, extra = compare(gloo, ours, known)

    def count(r, s):
        return sum(v == s for v in r.values())

    on_hosts = f", shardwise's ranks on {args.hosts} pretend hosts" if args.hosts else ""
    lines = [
        f"# PyTorch's distributed suite on the shardwise backend vs gloo (world {args.world}"
        f"{on_hosts})",
        "",
        f"- command: `python tests/conformance/run.py {' '.join(sys.argv[1:])}`",
        "",
        "| backend | passed | failed | skipped | seconds |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in (("gloo", gloo), ("shardwise", ours)):
        lines.append(
            f"| {name} | {count(r, 'passed')} | {count(r, 'failed')} | {count(r, 'skipped')} | "
            f"{times[name]:.0f} |"
        )
    lines += ["", f"Passing on gloo, not on shardwise: {len(unexplained) + len(explained)} "
              f"({len(explained)} explained in known_differences.txt)", ""]  # fmt: skip
    lines += [f"- UNEXPLAINED {n}: {ours.get(n, 'not run')}" for n in unexplained]
    lines += [f"- {n}: {known[n]}" for n in explained]
    if extra:
        lines += ["", f"Passing on shardwise, not on gloo: {', '.join(extra)}"]
    ran = count(gloo, "passed") > 0
    chosen = sorted(listed(HERE / f"{args.subset}_subset.txt")) if args.subset else []
    not_on_gloo = [n for n in chosen if gloo.get(n) != "passed"]
    if not_on_gloo:  # the sample is of tests gloo passes
        lines += ["", f"Listed in {args.subset}_subset.txt but not passing on gloo: "
                  + ", ".join(not_on_gloo)]  # fmt: skip
    return lines, ran and not unexplained and not not_on_gloo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--subset", help="a name: runs the tests listed in NAME_subset.txt")
    parser.add_argument("--decorated", help="runs the tests carrying this decorator")
    parser.add_argument("-k", help="a pytest -k expression instead of a subset")
    parser.add_argument("--stop", action="store_true", help="stop at the first failure")
    parser.add_argument("--reuse", default="", help="backends whose XML in --out is kept")
    parser.add_argument("--hosts", type=int, default=0, help="run shardwise's ranks as if on "
                        "this many hosts (SHARDWISE_HOST_ID); it must divide --world")  # fmt: skip
    args = parser.parse_args()
    if args.hosts and (args.hosts < 2 or args.world % args.hosts):
        parser.error(f"--hosts {args.hosts}: at least 2, dividing --world ({args.world})")
    if sum(map(bool, (args.subset, args.decorated, args.k))) > 1:
        parser.error("give at most one of --subset, --decorated and -k")
    args.out = args.out.resolve()  # pytest runs in this folder: paths given to it are absolute
    args.out.mkdir(parents=True, exist_ok=True)
    gated = args.out / "gated"
    subprocess.run([sys.executable, str(HERE / "gate.py"), str(gated)], check=True)
    results, times = {}, {}
    for backend in ("gloo", "shardwise"):
        xml = args.out / f"{backend}-world{args.world}.xml"
        if backend in args.reuse.split(",") and xml.exists():  # e.g. gloo's, from an earlier run
            results[backend], times[backend] = outcomes(xml), 0.0
        else:
            results[backend], times[backend] = run_backend(backend, args, gated)
    known = listed(HERE / "known_differences.txt")
    lines, ok = report(args, results["gloo"], results["shardwise"], times, known)
    text = "\n".join(lines) + "\n"
    (args.out / f"report-world{args.world}.md").write_text(text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
