"""training.compile against eager: the GPT's train step (forward, backward, AdamW step) with its
blocks compiled as shardwise-train compiles them (``parallelize.compile_blocks``), beside the
same model eager, in one process (the compute a rank does; data parallelism adds the same
communication to both), interleaved round by round.

Reported per precision (median over the rounds): the step in seconds and tokens/s, eager and
compiled, the speed-up, and the seconds the first compiled step took (tracing and compiling).

Run: python benchmarks/bench_compile.py --model small --output \
        benchmarks/results/DATE-compile-cpu.md
"""

import argparse
import copy
import datetime
import os
import statistics
import time
from pathlib import Path

import torch
from report import emit
from shardwise.models import GPT, PRESETS
from shardwise.train.parallelize import StrategyOptions, autocast_context, compile_blocks


def cpu_model() -> str:
    from shardwise.train.device_check import describe

    return describe(torch.device("cpu"))["name"]


def stepper(model, precision: str, device: str):
    """One train step of ``model`` on a batch: seconds (synchronized on a GPU)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(tokens) -> float:
        start = time.perf_counter()
        with autocast_context(precision, device):
            loss = model.loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    return step


def measure(name: str, precision: str, batch: int, rounds: int, steps: int, device: str):
    cfg = PRESETS[name]
    torch.manual_seed(0)
    eager = GPT(cfg).to(device)
    compiled = copy.deepcopy(eager)
    compile_blocks(compiled, StrategyOptions(gpt=cfg, compile=True))
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), device=device)
    run = {
        "eager": stepper(eager, precision, device),
        "compiled": stepper(compiled, precision, device),
    }
    first = {k: f(tokens) for k, f in run.items()}  # warm-up; compiled: the compilation
    times = {k: [] for k in run}
    for _ in range(rounds):
        for kind, f in run.items():
            times[kind].append(statistics.median(f(tokens) for _ in range(steps)))
    return {k: statistics.median(v) for k, v in times.items()}, first, batch * cfg.seq_len


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precisions", default="no,bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    where = (
        torch.cuda.get_device_name() if args.device == "cuda"
        else f"{cpu_model()}, {os.cpu_count()} cores"
    )  # fmt: skip
    lines = [
        f"# torch.compile against eager, GPT `{args.model}` train step ({datetime.date.today()})",
        "",
        f"{where}; torch {torch.__version__}; batch {args.batch} x {PRESETS[args.model].seq_len} "
        f"tokens, one process; median of {args.rounds} interleaved rounds of {args.steps} steps; "
        "the first compiled step with inductor's on-disk cache as this machine had it.",
        "",
        "| precision | eager step s | compiled step s | eager tokens/s | compiled tokens/s "
        "| speed-up | first compiled step s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for precision in args.precisions.split(","):
        median, first, tokens = measure(
            args.model, precision, args.batch, args.rounds, args.steps, args.device
        )
        e, c = median["eager"], median["compiled"]
        lines.append(
            f"| {'fp32' if precision == 'no' else precision} | {e:.3f} | {c:.3f} | "
            f"{tokens / e:,.0f} | {tokens / c:,.0f} | {e / c:.2f}x | {first['compiled']:.1f} |"
        )
    emit(lines, args.output)


if __name__ == "__main__":
    main()
