"""DeepSpeed's ZeRO++ keys across emulated hosts: ZeRO-3 training of the bundled GPT on K network
namespaces x R ranks (tests/distributed/hosts.py, each host's link shaped with tc's tbf), without
and with each key: zero_hpz_partition_size = R (hpZ), zero_quantized_weights (qwZ),
zero_quantized_gradients (qgZ), and all three.

Per variant, from fresh launches interleaved (zero3, hpz, qwz, qgz, zeropp, zero3, ...): the bytes
all ranks sent to other hosts per step (the TCP links' own count, shardwise._C.tcp_bytes_sent),
tokens/s (the global batch over the slowest rank's step, median over the timed steps), and the
loss curve against plain ZeRO-3's in the same launch round (the data and the initial weights
are the same in every launch; the largest relative difference over the steps), and, with
--curve-every K, the loss every K steps, each the mean over the K steps it ends (median over
launches). The data (--data): the bundled byte-level corpus (corpus, the default: a curve that
falls, as training's does) or uniform random tokens (random: nothing to learn). The first two
steps are not timed (the first checks the forward order).

Needs root (ip netns, tc). Run: python benchmarks/bench_zeropp.py --hosts 2 --ranks-per-host 2
--rate 1gbit --steps 200 --curve-every 25 --output benchmarks/results/DATE-zeropp-2x2-1gbit-cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "distributed"))

from hosts import emulated_hosts, rate_argument, start_ranks, training_arguments  # noqa: E402
from report import emit, table  # noqa: E402

# A variant: what it adds to zero_optimization ("hpz" sizes come from --ranks-per-host).
VARIANTS = {
    "zero3": {},
    "hpz": {"zero_hpz_partition_size": "per_host"},
    "qwz": {"zero_quantized_weights": True},
    "qgz": {"zero_quantized_gradients": True},
    "zeropp": {"zero_hpz_partition_size": "per_host", "zero_quantized_weights": True,
               "zero_quantized_gradients": True},
}  # fmt: skip


def worker(variant: str, args) -> None:
    """One rank: trains args.steps steps; rank 0 prints one JSON row per step."""
    import shardwise.zero
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from shardwise import _C
    from shardwise.models.gpt import GPT, PRESETS
    from shardwise.train.data import TokenStream, corpus_splits

    dist.init_process_group("shardwise")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg, micro, per_host = PRESETS[args.preset], args.micro, args.ranks_per_host
    torch.manual_seed(0)
    zero = {"stage": 3}
    for key, value in VARIANTS[variant].items():
        zero[key] = per_host if value == "per_host" else value
    config = {"train_micro_batch_size_per_gpu": micro, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}  # fmt: skip
    engine = shardwise.zero.initialize(GPT(cfg), config)
    data = torch.Generator().manual_seed(1234)
    if args.data == "corpus":
        stream = TokenStream(corpus_splits()[0], cfg.seq_len, micro, rank, world, seed=0)
    for step in range(args.steps):
        if args.data == "corpus":
            inputs, targets = next(stream)
        else:
            tokens = torch.randint(0, cfg.vocab_size, (micro * world, cfg.seq_len + 1),
                                   generator=data)[rank * micro : (rank + 1) * micro]  # fmt: skip
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
        dist.barrier()
        start, sent = time.perf_counter(), _C.tcp_bytes_sent()
        logits = engine(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), targets.reshape(-1))
        engine.backward(loss)
        engine.step()
        seconds, sent = time.perf_counter() - start, _C.tcp_bytes_sent() - sent
        totals = torch.tensor([loss.item(), float(sent)], dtype=torch.float64)
        slowest = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(totals)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            row = {"step": step, "loss": totals[0].item() / world, "sent": totals[1].item(),
                   "seconds": slowest.item(), "tokens": micro * world * cfg.seq_len}  # fmt: skip
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def launch(hosts, per_host: int, variant: str, args) -> list[dict]:
    """One fresh launch of len(hosts) * per_host ranks; rank 0's rows."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", variant, "--preset",
            args.preset, "--steps", str(args.steps), "--micro", str(args.micro),
            "--ranks-per-host", str(per_host), "--data", args.data]  # fmt: skip
    port = str(random.randint(20000, 60000))  # each namespace has ports of its own
    procs = start_ranks(hosts, per_host, argv, port)
    outputs = [p.communicate(timeout=3600) for p in procs]
    if any(p.returncode for p in procs):
        errors = "".join(err[-2000:] for _, err in outputs)
        raise RuntimeError(f"{variant} failed on {len(hosts)} x {per_host}:\n{errors}")
    return [json.loads(line) for line in outputs[0][0].splitlines() if line.startswith("{")]


def summary(runs: dict[str, list[list[dict]]], variant: str) -> list[str]:
    """The table's cells for a variant: MB to other hosts per step, tokens/s min / median / max,
    the last step's loss, the largest relative loss difference from zero3 in the same round."""
    timed = [run[2:] for run in runs[variant]]
    sent = statistics.median(statistics.median(r["sent"] for r in run) for run in timed)
    rates = sorted(statistics.median(r["tokens"] / r["seconds"] for r in run) for run in timed)
    drift = max(
        abs(a["loss"] - b["loss"]) / abs(b["loss"])
        for ours, plain in zip(runs[variant], runs["zero3"], strict=True)
        for a, b in zip(ours, plain, strict=True)
    )
    return [f"{sent / 1e6:.2f}", f"{rates[0]:.0f} / {statistics.median(rates):.0f} / "
            f"{rates[-1]:.0f}", f"{runs[variant][0][-1]['loss']:.4f}", f"{drift:.2e}"]  # fmt: skip


def curve(runs: dict[str, list[list[dict]]], variants: list[str], every: int) -> list[str]:
    """The loss curve table: per variant, the mean loss over each `every` steps (median over
    launches)."""
    ends = range(every, len(runs["zero3"][0]) + 1, every)

    def point(variant: str, end: int) -> float:
        return statistics.median(
            statistics.fmean(r["loss"] for r in run[end - every : end]) for run in runs[variant]
        )

    head = ["steps", *variants]
    lines = [f"Loss curve: mean loss over each {every} steps, median over launches", "",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]  # fmt: skip
    for end in ends:
        cells = [f"{end - every + 1}-{end}"] + [f"{point(v, end):.4f}" for v in variants]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    training_arguments(parser, hosts=2, steps=20)
    parser.add_argument("--data", choices=("corpus", "random"), default="corpus")
    parser.add_argument("--curve-every", type=int, default=0,
                        help="a second table: the loss every K steps (0: none)")  # fmt: skip
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--launches", type=int, default=2)
    parser.add_argument("--output")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args)
        return 0
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown or "zero3" not in variants:
        parser.error(f"--variants: unknown {sorted(unknown)} (zero3 is needed, the reference); "
                     f"choose from {', '.join(VARIANTS)}")  # fmt: skip
    if args.hosts < 2 or args.ranks_per_host < 2 or args.launches < 1 or args.steps < 3:
        parser.error("--hosts and --ranks-per-host need at least 2, --launches 1, --steps 3")
    if not 0 <= args.curve_every <= args.steps:
        parser.error(f"--curve-every: 0 (no curve) to --steps ({args.steps}), got "
                     f"{args.curve_every}")  # fmt: skip
    rate = rate_argument(parser, args.rate)
    import torch

    runs: dict[str, list[list[dict]]] = {v: [] for v in variants}
    with emulated_hosts(args.hosts, rate) as hosts:
        for _ in range(args.launches):
            for variant in variants:
                runs[variant].append(launch(hosts, args.ranks_per_host, variant, args))
    head = ["variant", "MB to other hosts per step", "tokens/s min / median / max",
            "last loss", "max relative loss difference from zero3"]  # fmt: skip
    lines = [
        f"# ZeRO++ keys across {args.hosts} emulated hosts x {args.ranks_per_host} ranks, links "
        f"{args.rate} ({datetime.date.today()})",
        "",
        f"- machine: {os.cpu_count()} cores; torch {torch.__version__}; GPT preset "
        f"{args.preset}, {args.micro} sequence(s) per rank, {args.steps} steps (the first two "
        f"untimed), {args.launches} launches of each variant, interleaved; data: {args.data}",
        f"- command: `python benchmarks/bench_zeropp.py {' '.join(sys.argv[1:])}`",
        "",
        *table(head, [[v, *summary(runs, v)] for v in variants]),
    ]
    if args.curve_every:
        lines += ["", *curve(runs, variants, args.curve_every)]
    emit(lines, Path(args.output) if args.output else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
