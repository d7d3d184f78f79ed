"""DeepSpeed as the peer, on CPU: the bundled GPT trained with one ds_config (bf16, AdamW, ZeRO
stage 1, 2 or 3, gradient clipping) by shardwise.zero and by DeepSpeed itself (CPU accelerator,
torch's AdamW through ``torch_adam``: DeepSpeed's fused Adam needs CUDA), world 2, interleaved.

Rows per stage: shardwise (its backend), DeepSpeed on its default CPU backend (gloo), DeepSpeed
over the shardwise backend (the same transport as shardwise: the engines compared alone). The
limit: ``compute-only``, one process running shardwise.zero with the same config on the same
per-rank batch, so no byte is communicated (its optimizer steps the whole model where a rank of
two steps half, so the limit is slightly pessimistic). Each configuration is started
``--repeats`` times, the configurations interleaved within each round; reported: the median
step time (max over ranks) and tokens/s, peak RSS per rank (ru_maxrss, the Python + torch +
DeepSpeed baseline included), and the loss curve, which every row computes on the same batches
(the largest difference from shardwise's curve is given).

Run: python benchmarks/bench_deepspeed.py --output benchmarks/results/DATE-deepspeed-cpu.md
"""

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

from bench_fsdp import launch
from report import emit

STAGES = (1, 2, 3)
ROWS = ("shardwise", "deepspeed-gloo", "deepspeed-shardwise")


def ds_config(stage: int, batch: int) -> dict:
    """The one config both engines read."""
    return {
        "train_micro_batch_size_per_gpu": batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1, "torch_adam": True},
        },
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def build(row: str, stage: int, model, batch: int):
    """(engine, backward(loss), step()) of one row; the process group is up."""
    config = ds_config(stage, batch)
    if row.startswith("deepspeed"):
        import deepspeed

        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=config
        )
        return engine
    import shardwise.zero

    return shardwise.zero.initialize(model, config)


def run_rank(name: str, args) -> None:
    import torch
    import torch.distributed as dist
    from shardwise.models import GPT, PRESETS

    row, stage = name.rsplit("@", 1)
    stage = int(stage)
    torch.set_num_threads(1)
    if row.startswith("deepspeed"):
        import deepspeed
        import shardwise  # noqa: F401  (registers the backend DeepSpeed may run over)

        deepspeed.init_distributed(dist_backend="gloo" if row.endswith("gloo") else "shardwise")
    else:
        import shardwise  # noqa: F401

        dist.init_process_group("shardwise")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PRESETS[args.model]
    torch.manual_seed(0)
    model = GPT(cfg)
    engine = build(row, stage, model, args.batch)
    g = torch.Generator().manual_seed(1)
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, cfg.vocab_size, (args.batch * 2, cfg.seq_len + 1), generator=g)
        tokens = tokens[rank * args.batch : (rank + 1) * args.batch]  # world 1: rank 0's half
        dist.barrier()
        start = time.perf_counter()
        loss = model.cross_entropy(engine(tokens[:, :-1]), tokens[:, 1:])
        engine.backward(loss)
        engine.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        mean = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    step_time = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(step_time, op=dist.ReduceOp.MAX)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0])
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        result = {
            "row": row,
            "stage": stage,
            "step_s": step_time.item(),
            "tokens_per_s": args.batch * world * cfg.seq_len / step_time.item(),
            "peak_rss": rss.item(),
            "losses": losses,
        }
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def measure(args) -> dict:
    """Every (row, stage) and the compute-only limit, ``repeats`` interleaved rounds."""
    runs: dict = {}
    world = args.world
    for _ in range(args.repeats):
        for stage in args.stages:
            for row in args.rows:
                args.world = world
                runs.setdefault((row, stage), []).append(launch(f"{row}@{stage}", args, __file__))
        args.world = 1
        runs.setdefault(("compute-only", 1), []).append(launch("compute-only@1", args, __file__))
        args.world = world
    return runs


def summary(samples: list[dict]) -> dict:
    return {
        "step_s": statistics.median(s["step_s"] for s in samples),
        "tokens_per_s": statistics.median(s["tokens_per_s"] for s in samples),
        "peak_rss": statistics.median(s["peak_rss"] for s in samples),
        "losses": samples[0]["losses"],
    }


def table(runs: dict, args) -> list[str]:
    import deepspeed
    import torch
    from shardwise.models import PRESETS

    model = PRESETS[args.model]
    limit = summary(runs[("compute-only", 1)])
    lines = [
        f"# ZeRO on CPU: shardwise.zero vs DeepSpeed {deepspeed.__version__}, one ds_config "
        f"({datetime.date.today()})",
        "",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"torch {torch.__version__}",
        f"- command: `python benchmarks/bench_deepspeed.py {' '.join(sys.argv[1:])}`",
        f"- model: GPT `{args.model}` ({model.num_parameters() / 1e6:.1f}M parameters, sequence "
        f"{model.seq_len}), batch {args.batch} per rank, world {args.world}, {args.steps} timed "
        f"steps after {args.warmup} warm-up, {args.repeats} interleaved rounds (medians)",
        "- config (both engines): bf16, AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1; "
        "DeepSpeed: torch's AdamW via torch_adam), gradient clipping 1.0, overlap_comm",
        f"- limit: compute-only step (1 process, same per-rank batch, no communication): "
        f"{limit['step_s']:.3f} s",
        "",
        "| stage | engine | backend | step s | tokens/s | shardwise vs it | limit / step "
        "| peak RSS MB/rank | max loss diff vs shardwise |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for stage in args.stages:
        ours = summary(runs[("shardwise", stage)])
        for row in args.rows:
            r = summary(runs[(row, stage)])
            engine, _, backend = row.partition("-")
            diff = max(abs(a - b) for a, b in zip(r["losses"], ours["losses"], strict=True))
            lines.append(
                f"| {stage} | {engine} | {backend or 'shardwise'} | {r['step_s']:.3f} | "
                f"{r['tokens_per_s']:.0f} | {ours['tokens_per_s'] / r['tokens_per_s']:.2f}x | "
                f"{limit['step_s'] / r['step_s']:.2f} | {r['peak_rss'] / 2**20:.0f} | "
                f"{diff:.4f} |"
            )
    return lines


def main() -> int:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before any import of deepspeed
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stages", type=lambda s: [int(x) for x in s.split(",")], default=STAGES)
    parser.add_argument("--rows", type=lambda s: s.split(","), default=ROWS)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        run_rank(args.rank_of, args)
        return 0
    runs = measure(args)
    (args.output.with_suffix(".json") if args.output else Path(os.devnull)).write_text(
        json.dumps({f"{k[0]}@{k[1]}": v for k, v in runs.items()})
    )
    emit(table(runs, args), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
