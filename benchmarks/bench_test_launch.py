"""What a distributed test pays before its first check: a fresh launch (torchrun, then every rank
importing torch, shardwise and the trainer) against the tests' launch pool (ranks forked from a
process that imported them once, tests/distributed/rank_pool.py). Each launch runs 2 ranks to
the end of one all_reduce over the shardwise backend; the time is the launcher's wall clock
from start to exit, over --repeats launches of each kind, interleaved (min / median / max).

    python benchmarks/bench_test_launch.py --repeats 10 \
        --output benchmarks/results/DATE-test-launch-cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "distributed"))

import rank_pool  # noqa: E402

RANK = """
import torch, torch.distributed as dist
import shardwise.train.cli  # what a trainer run imports before it checks anything
from shardwise.distributed import init_process_group
init_process_group("shardwise")
t = torch.ones(4)
dist.all_reduce(t)
assert t[0].item() == dist.get_world_size()
dist.destroy_process_group()
"""


def _torchrun(script: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", script]  # fmt: skip


def fresh(script: str) -> float:
    start = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(_torchrun(script), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return time.perf_counter() - start


def pooled(script: str) -> float:
    start = time.perf_counter()
    proc = rank_pool.run(_torchrun(script), env=dict(os.environ, OMP_NUM_THREADS="1"),
                         capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return time.perf_counter() - start


def import_only(module: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "rank.py")
        Path(script).write_text(RANK)
        start = time.perf_counter()
        rank_pool.run([sys.executable, script], capture_output=True)  # starts the zygote
        zygote = time.perf_counter() - start
        rows: dict[str, list[float]] = {}
        for _ in range(args.repeats):  # interleaved, so load drifts hit every kind alike
            rows.setdefault("python -c 'import torch' (one process)", []).append(
                import_only("torch")
            )
            rows.setdefault("python -c 'import shardwise.train.cli' (one process)", []).append(
                import_only("shardwise.train.cli")
            )
            rows.setdefault("fresh: torchrun, 2 ranks, to one all_reduce", []).append(fresh(script))
            rows.setdefault("pool: 2 forked ranks, to one all_reduce", []).append(pooled(script))
    rank_pool.shutdown()
    lines = [
        f"# Test launches ({datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores)",
        "",
        f"Launcher wall time in seconds over {args.repeats} launches of each, interleaved; the "
        f"pool's zygote started once in {zygote:.2f} s (its imports).",
        "",
        "| launch | min | median | max |",
        "|---|---:|---:|---:|",
    ]
    for name, values in rows.items():
        lines.append(
            f"| {name} | {min(values):.2f} | {statistics.median(values):.2f} | {max(values):.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
