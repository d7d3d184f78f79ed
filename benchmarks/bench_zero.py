"""ZeRO training benchmark on CPU: the bundled GPT (``small``: ~23M parameters, sequence 256)
at world 2, shardwise ZeRO stages 1/2/3 beside torch DDP and torch's ZeroRedundancyOptimizer
(ZeRO-1, under DDP), in the same run, each in its own processes.

shardwise rows run ZeRO's mixed precision (``bf16.enabled``: bf16 parameters and gradients,
fp32 master partitions and AdamW state, the fused C++ AdamW writing the bf16 copy); the torch
rows run bf16 autocast over fp32 parameters (torch has no bf16-parameter ZeRO). Reported: step
time (median of the timed steps, max over ranks), tokens/s (all ranks), peak RSS per rank
(``ru_maxrss``, includes the Python/torch baseline) and model-state bytes per rank counted from
tensor storages (parameters + gradients + optimizer state, measured after backward, before the
optimizer step, where gradients are alive), and the loss after the last step.

Run: python benchmarks/bench_zero.py --output benchmarks/results/DATE-zero-cpu.md
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

from bench_fsdp import launch as launch_ranks
from report import emit

FRAMEWORKS = ("zero1", "zero2", "zero3", "ddp", "torch-zero1")


def torch_state_bytes(model, optimizer) -> int:
    import torch

    inner = getattr(optimizer, "optim", optimizer)
    tensors = list(model.parameters()) + [p.grad for p in model.parameters() if p.grad is not None]
    for state in inner.state.values():
        tensors += [t for t in state.values() if torch.is_tensor(t) and t.dim() > 0]
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def build(framework, model, cfg, args):
    import shardwise.zero
    import torch

    if framework.startswith("zero"):
        config = {
            "train_micro_batch_size_per_gpu": args.batch,
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": int(framework[-1]), "reduce_bucket_size": 5e6},
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        }
        return shardwise.zero.initialize(model, config), None
    model = torch.nn.parallel.DistributedDataParallel(model)
    if framework == "ddp":
        return model, torch.optim.AdamW(model.parameters(), lr=3e-4)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=3e-4)
    return model, opt


def run_rank(framework: str, args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from shardwise.models import GPT, PRESETS

    torch.set_num_threads(1)
    ours = framework.startswith("zero")
    dist.init_process_group("shardwise" if ours else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PRESETS[args.model]
    torch.manual_seed(0)
    model, opt = build(framework, GPT(cfg), cfg, args)
    g = torch.Generator().manual_seed(1)
    times, loss, state = [], None, 0
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(
            0, cfg.vocab_size, (args.batch * world, cfg.seq_len + 1), generator=g
        )
        tokens = tokens[rank * args.batch : (rank + 1) * args.batch]
        dist.barrier()
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not ours):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(
            logits.float().reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1)
        )
        if ours:
            model.backward(loss)
            state = sum(model.memory_bytes().values())
            model.step()
        else:
            loss.backward()
            state = torch_state_bytes(model, opt)
            opt.step()
            opt.zero_grad(set_to_none=False)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    step_time = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(step_time, op=dist.ReduceOp.MAX)
    stats = torch.tensor([peak_rss, state], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    final = torch.tensor([loss.item()], dtype=torch.float64)
    dist.all_reduce(final)
    if rank == 0:
        print(
            json.dumps(
                {
                    "framework": framework,
                    "step_s": step_time.item(),
                    "tokens_per_s": args.batch * world * cfg.seq_len / step_time.item(),
                    "peak_rss": stats[0].item(),
                    "state_bytes": stats[1].item(),
                    "loss": final.item() / world,
                }
            ),
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def table(results: list[dict], args) -> list[str]:
    import torch
    from shardwise.models import PRESETS

    base = {r["framework"]: r for r in results}
    model = PRESETS[args.model]
    lines = [
        f"# ZeRO training on CPU: shardwise stages 1-3 vs DDP vs ZeroRedundancyOptimizer "
        f"({datetime.date.today()})",
        "",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"torch {torch.__version__}",
        f"- command: `python benchmarks/bench_zero.py {' '.join(sys.argv[1:])}`",
        f"- model: GPT `{args.model}` ({model.num_parameters() / 1e6:.1f}M parameters, "
        f"sequence {model.seq_len}), batch {args.batch} per rank, world {args.world}, AdamW, "
        f"{args.steps} timed steps after {args.warmup} warm-up",
        "- zero rows: shardwise, bf16 parameters + fp32 master partitions; ddp / torch-zero1: "
        "bf16 autocast over fp32 parameters (gloo)",
        "",
        "| framework | step s | tokens/s | vs ddp | peak RSS MB/rank | model state MB/rank "
        "| final loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['framework']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | "
            f"{r['tokens_per_s'] / base.get('ddp', r)['tokens_per_s']:.2f}x | "
            f"{r['peak_rss'] / 2**20:.0f} | {r['state_bytes'] / 2**20:.1f} | {r['loss']:.4f} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--output", type=Path)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        run_rank(args.rank_of, args)
        return 0
    results = []
    for framework in args.frameworks.split(","):
        results.append(launch_ranks(framework, args, __file__))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    emit(table(results, args), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
