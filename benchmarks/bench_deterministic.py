"""training.deterministic's cost: shardwise-train on the GPT with and without the mode, the same
global batch, interleaved run by run, for each strategy, data-parallel size and backend.

Reported (median over the rounds of each run's steps after the first two): the step in seconds,
the peak resident memory of the largest rank (MB), both modes and their ratio; and the limit,
the compute-only step (world 1, no communication, the same micro-batch). The mode's own costs:
a collective per micro-batch (DDP; ZeRO stages 0-1), the float32 tree, the exact clip norm,
and up to log2(accumulation) + 1 partial sums of the gradient shards.

Run: python benchmarks/bench_deterministic.py --model small \
        --output benchmarks/results/DATE-deterministic-small-cpu.md
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from report import emit

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = {  # name: overrides on examples/configs/ddp.yaml
    "fsdp": ("distributed.strategy=fsdp",),
    "zero2": ("distributed.strategy=zero", "distributed.zero.zero_optimization.stage=2"),
    # 2 stages (world 4: 2 pipelines data parallel), each step 2 microbatches of micro-batch rows
    "pipeline": (
        "distributed.strategy=pipeline",
        "distributed.pipeline_parallel_size=2",
        "distributed.pipeline.num_microbatches=2",
    ),  # fmt: skip
}
# The limit's run where the strategy cannot run on one rank: the pipeline's two microbatches as
# two accumulated micro-batches of the whole model.
LIMITS = {"pipeline": ("training.gradient_accumulation_steps=2",)}


def train(world: int, overrides: list[str]) -> list[dict]:
    """One shardwise-train run; its metrics records (rank 0's)."""
    with tempfile.TemporaryDirectory() as out:
        launcher = [sys.executable]
        if world > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone",
                         f"--nproc_per_node={world}"]  # fmt: skip
        command = [*launcher, "-m", "shardwise.train", "--config",
                   str(ROOT / "examples/configs/ddp.yaml"), f"training.checkpoint.dir={out}",
                   *overrides]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        path = Path(out) / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(records: list[dict]) -> tuple[float, float]:
    """(median step seconds after the first two steps, peak RSS of the largest rank in MB)."""
    steps = [r["step_s"] for r in records if r["step"] > 2]
    return statistics.median(steps), max(max(r["peak_rss_mb_per_rank"]) for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--backends", default="shardwise,gloo")
    parser.add_argument("--strategies", default="fsdp,zero2")  # or pipeline
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    base = [f"model.preset={args.model}", "training.mixed_precision=no",
            f"training.micro_batch_size={args.micro_batch}", "training.eval_every=0",
            f"training.max_steps={args.steps}", "training.warmup_steps=1",
            "training.checkpoint.every_steps=1000", "training.gradient_accumulation_steps=1",
            "training.lr_scaling=none"]  # fmt: skip
    rows = []
    for strategy in args.strategies.split(","):
        alone = LIMITS.get(strategy, STRATEGIES[strategy])
        one = [*base, *alone, "training.deterministic=true"]  # one thread
        limit = statistics.median(summary(train(1, one))[0] for _ in range(args.rounds))
        for world in (int(w) for w in args.worlds.split(",")):
            for backend in args.backends.split(","):
                runs = {False: [], True: []}
                for _ in range(args.rounds):  # interleaved: default, deterministic, default, ..
                    for mode in runs:
                        overrides = [*base, *STRATEGIES[strategy], f"distributed.backend={backend}",
                                     f"training.deterministic={str(mode).lower()}"]  # fmt: skip
                        runs[mode].append(summary(train(world, overrides)))
                (s0, m0), (s1, m1) = (
                    (statistics.median(x[0] for x in r), statistics.median(x[1] for x in r))
                    for r in (runs[False], runs[True])
                )
                rows.append(f"| {strategy} | {world} | {backend} | {s0:.3f} | {s1:.3f} | "
                            f"{s1 / s0:.2f}x | {m0:.0f} | {m1:.0f} | {m1 / m0:.2f}x | "
                            f"{limit:.3f} |")  # fmt: skip
    cpu = f"{os.cpu_count()} cores"
    lines = [
        f"# training.deterministic's cost, GPT `{args.model}` ({datetime.date.today()})",
        "",
        f"CPU, {cpu}; torch {torch.__version__}; fp32; micro-batch {args.micro_batch} per rank, "
        f"no accumulation (global batch {args.micro_batch} x world; the pipeline: 2 stages, "
        f"2 microbatches of {args.micro_batch} per step and pipeline); median of {args.rounds} "
        f"interleaved runs of {args.steps} steps (steps 3+); one intra-op thread per rank in "
        "both modes (the default gives cores / ranks, 1 here). Memory: peak RSS of the largest "
        "rank. Limit: the compute-only step (world 1, the same micro-batch).",
        "",
        "| strategy | world | backend | default step s | deterministic step s | time "
        "| default MB | deterministic MB | memory | limit step s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    emit(lines, args.output)


if __name__ == "__main__":
    main()
