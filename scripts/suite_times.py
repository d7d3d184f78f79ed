#!/usr/bin/env python3
"""Where `make test`'s time goes: each suite's command run through this script, and a table at
the end (what ran, how long, how many tests).

    suite_times.py run NAME -- COMMAND...   runs COMMAND, passing its output through, and adds a
                                            row (NAME, seconds, tests counted, exit status)
    suite_times.py report                   prints the rows as a table (Markdown)
    suite_times.py reset                    starts a new table (and its wall clock)

The rows live in $SUITE_TIMES (default build/suite-times.tsv). Tests are counted from the
runner's own closing line: pytest's "N passed, M skipped", ctest's "out of N", libFuzzer's
"Done N runs" (one row per target run). A row also counts the compilations the command asked
of ccache (its statistics before and after): hits, and misses (sources compiled), and how many
of the machine's cores were busy on average while it ran (from /proc/stat: a suite that keeps
them idle is one to overlap with another). The times are a report, never a failure: the exit
status is COMMAND's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

TABLE = Path(os.environ.get("SUITE_TIMES", "build/suite-times.tsv"))
PYTEST = re.compile(r"=+ (.*?\d+ (?:passed|failed|skipped|error|errors|deselected).*?) in [\d.]+s")
CTEST = re.compile(r"tests passed, (\d+) tests failed out of (\d+)")
FUZZ = re.compile(r"^Done (\d+) runs in", re.MULTILINE)


def count(output: str) -> str:
    """The tests the output's runner reports, as it says them ('' when it names none)."""
    pytest = PYTEST.findall(output)
    if pytest:
        totals: dict[str, int] = {}
        for line in pytest:
            for number, word in re.findall(r"(\d+) (\w+)", line):
                word = "error" if word == "errors" else word
                totals[word] = totals.get(word, 0) + int(number)
        return ", ".join(f"{n} {w}" for w, n in totals.items())
    ctest = CTEST.findall(output)
    if ctest:
        failed = sum(int(f) for f, _ in ctest)
        total = sum(int(t) for _, t in ctest)
        return f"{total - failed} passed, {failed} failed"
    fuzz = FUZZ.findall(output)
    if fuzz:
        return f"{len(fuzz)} targets, {sum(int(n) for n in fuzz)} inputs"
    return ""


def compiler_cache() -> tuple[int, int]:
    """ccache's (hits, misses) so far; (0, 0) without ccache."""
    if shutil.which("ccache") is None:
        return 0, 0
    stats = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True).stdout
    values = dict(line.split("\t") for line in stats.splitlines() if "\t" in line)
    hits = int(values.get("direct_cache_hit", 0)) + int(values.get("preprocessed_cache_hit", 0))
    return hits, int(values.get("cache_miss", 0))


def cpu_jiffies() -> tuple[int, int]:
    """The machine's (busy, total) CPU time so far, in clock ticks summed over its cores; (0, 0)
    where /proc/stat is missing."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    # user, nice, system, idle, iowait, irq, softirq, steal (guest time is inside user's)
    busy = sum(fields[0:3]) + sum(fields[5:7])
    return busy, sum(fields[:8])


def cores_busy(before: tuple[int, int], after: tuple[int, int]) -> str:
    """The average number of cores busy between two cpu_jiffies() readings, e.g. '1.7'."""
    busy, total = after[0] - before[0], after[1] - before[1]
    cores = os.cpu_count() or 1
    return f"{cores * busy / total:.1f}" if total > 0 else ""


def run(name: str, command: list[str]) -> int:
    name += os.environ.get("SUITE_TIMES_NOTE", "")  # e.g. a build run beside other suites
    cache_before = compiler_cache()
    cpu_before = cpu_jiffies()
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    kept: list[bytes] = []
    for line in proc.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        kept.append(line)
    code = proc.wait()
    seconds = time.monotonic() - start
    busy = cores_busy(cpu_before, cpu_jiffies())
    tests = count(b"".join(kept).decode(errors="replace"))
    cache_after = compiler_cache()
    hits, misses = cache_after[0] - cache_before[0], cache_after[1] - cache_before[1]
    compiled = f"{hits} hits, {misses} misses" if hits or misses else ""
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    with TABLE.open("a") as table:
        table.write(f"{name}\t{seconds:.0f}\t{tests}\t{compiled}\t{busy}\t{code}\n")
    return code


def report() -> None:
    lines = TABLE.read_text().splitlines() if TABLE.exists() else []
    started = [float(line.split("\t")[1]) for line in lines if line.startswith("#start\t")]
    rows = [line.split("\t") for line in lines if not line.startswith("#")]
    if not rows:
        print("suite times: no suite ran")
        return
    total = sum(int(row[1]) for row in rows)
    print("\n| suite | seconds | minutes | tests | compiler cache | cores busy | exit |")
    print("|---|---:|---:|---|---|---:|---:|")
    for row in rows:
        if len(row) == 5:  # a row written before the cores-busy column
            row.insert(4, "")
        name, seconds, tests, compiled, busy, code = row
        print(
            f"| {name} | {seconds} | {int(seconds) / 60:.1f} | {tests} | {compiled} | {busy} "
            f"| {code} |"
        )
    print(f"| all suites | {total} | {total / 60:.1f} | | | | |")
    if started:  # builds run beside other suites make the sum exceed the wall-clock time
        wall = time.time() - started[0]
        print(f"| wall clock since the start | {wall:.0f} | {wall / 60:.1f} | | | | |")


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"] and len(argv) > 3 and argv[2] == "--":
        return run(argv[1], argv[3:])
    if argv == ["report"]:
        report()
        return 0
    if argv == ["reset"]:
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        TABLE.write_text(f"#start\t{time.time():.0f}\n")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
