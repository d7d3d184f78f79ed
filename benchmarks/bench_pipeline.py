"""Pipeline benchmark on CPU: the bundled GPT (``small``) cut into p = 2 stages on 2 processes,
m = 8 microbatches, bf16 autocast. Reported in the same run:

- shardwise 1F1B (and GPipe, interleaved with 2 stages per rank) step time beside the ideal
  (the slower stage's measured forward + backward time per microbatch × (m + p - 1)), and the
  peak number of stashed microbatch-stages per rank;
- torch.distributed.pipelining ``Schedule1F1B`` on the same stages and the same process group.

The GPT's tied head is untied for both (a copy on the last stage). Each timed step is the max
over ranks, median of the timed steps; the frameworks take turns step by step (interleaved
rounds), so a slow phase of the VM hits them alike.

Run: python benchmarks/bench_pipeline.py --output benchmarks/results/DATE-pipeline-cpu.md
"""

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from bench_fsdp import launch as launch_ranks


def build_stages(cfg, layers_per_stage):
    import torch
    from shardwise.models import GPT
    from torch import nn

    torch.manual_seed(0)
    gpt = GPT(cfg)

    class First(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.pos = gpt.embed, gpt.pos
            self.blocks = nn.ModuleList(gpt.blocks[:layers_per_stage])

        def forward(self, tokens):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
                for b in self.blocks:
                    x = b(x)
            return x.float()

    class Last(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(gpt.blocks[layers_per_stage:])
            self.norm = gpt.norm
            self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
            self.head.weight = nn.Parameter(gpt.head.weight.detach().clone())

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                for b in self.blocks:
                    x = b(x)
                return self.head(self.norm(x)).float()

    return First(), Last()


def loss_fn(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def stage_time(stage, rank, cfg, args) -> float:
    """Forward + backward of this rank's stage on one microbatch, median of 6 after 2."""
    import torch

    tokens = torch.randint(0, cfg.vocab_size, (args.micro, cfg.seq_len + 1))
    x = tokens[:, :-1] if rank == 0 else torch.randn(args.micro, cfg.seq_len, cfg.dim)
    times = []
    for _ in range(8):
        start = time.perf_counter()
        if rank == 0:
            out = stage(x)
            out.backward(torch.randn_like(out))
        else:
            xin = x.clone().requires_grad_(True)
            loss_fn(stage(xin), tokens[:, 1:]).backward()
        times.append(time.perf_counter() - start)
    stage.zero_grad()
    return statistics.median(times[2:])


def run_rank(args) -> None:
    import shardwise.pipeline as pp
    import torch
    import torch.distributed as dist
    from shardwise.models import PRESETS

    torch.set_num_threads(1)
    dist.init_process_group("shardwise")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PRESETS[args.model]
    first, last = build_stages(cfg, cfg.layers // 2)
    stage = first if rank == 0 else last
    m = args.microbatches
    g = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, cfg.vocab_size, (m * args.micro, cfg.seq_len + 1), generator=g)
        for _ in range(args.warmup + args.steps)
    ]
    pipes = {
        kind: pp.Pipeline({rank: stage}, pp.make_schedule(kind, world, m), loss_fn)
        for kind in ("1f1b", "gpipe")
    }
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch_module = copy.deepcopy(stage)
    torch_stage = PipelineStage(torch_module, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(torch_stage, n_microbatches=m, loss_fn=loss_fn)

    def torch_step(tokens):
        if rank == 0:
            schedule.step(tokens[:, :-1])
        else:
            schedule.step(target=tokens[:, 1:])
        torch_module.zero_grad()

    runs = {
        f"shardwise {kind}": (lambda t, p=p: p.step(t[:, :-1], t[:, 1:]))
        for kind, p in pipes.items()
    }
    runs["torch Schedule1F1B"] = torch_step
    # Interleaved rounds (every framework once per round, same batch), so drift on the VM hits
    # all alike; the first round is warm-up.
    times = {name: [] for name in runs}
    for k, tokens in enumerate(batches):
        for name, run in runs.items():
            dist.barrier()
            start = time.perf_counter()
            run(tokens)
            stage.zero_grad()
            if k >= args.warmup:
                times[name].append(time.perf_counter() - start)
    rows = []
    for name, values in times.items():
        t = torch.tensor([statistics.median(values)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        peak = None
        if name.startswith("shardwise"):
            peak_t = torch.tensor([pipes[name.split()[1]].last["peak_stashed"]])
            dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
            peak = int(peak_t.item())
        rows.append({"framework": name, "step_s": t.item(), "peak": peak})
    actions, times_1f1b = pipes["1f1b"].gather_times()
    # The ideal, from the stages' own forward + backward time measured now (warm, same process).
    t_stage = torch.tensor([stage_time(stage, rank, cfg, args)], dtype=torch.float64)
    dist.all_reduce(t_stage, op=dist.ReduceOp.MAX)
    ideal = t_stage.item() * (m + world - 1)
    if rank == 0:
        from shardwise.pipeline import timeline

        print(
            json.dumps(
                {
                    "rows": rows,
                    "ideal_s": ideal,
                    "stage_s": t_stage.item(),
                    "text": timeline.render_text(actions, times_1f1b),
                    "png": str(
                        timeline.plot(
                            actions, times_1f1b, args.png, f"shardwise 1F1B, p={world}, m={m}:"
                        )
                    ),
                }
            )
        )
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--micro", type=int, default=1, help="sequences per microbatch")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--png", default="benchmarks/results/pipeline-1f1b-timeline.png")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        run_rank(args)
        return 0
    result = launch_ranks("pipeline", args, __file__)
    ideal = result["ideal_s"]
    torch_step = next(r for r in result["rows"] if r["framework"].startswith("torch"))["step_s"]
    import torch

    tokens = (
        args.microbatches
        * args.micro
        * __import__("shardwise.models").models.PRESETS[args.model].seq_len
    )
    lines = [
        f"# Pipeline on CPU: shardwise schedules vs torch.distributed.pipelining "
        f"({datetime.date.today()})",
        "",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"torch {torch.__version__}; backend shardwise for both",
        f"- command: `python benchmarks/bench_pipeline.py {' '.join(sys.argv[1:])}`",
        f"- GPT `{args.model}` in {args.world} stages, m = {args.microbatches} microbatches of "
        f"{args.micro} sequence(s), bf16 autocast; {args.steps} timed steps after {args.warmup}",
        f"- slower stage forward + backward per microbatch: {result['stage_s'] * 1e3:.1f} ms; "
        f"ideal step = that × (m + p - 1) = {ideal * 1e3:.1f} ms",
        "",
        "| schedule | step ms | vs ideal | tokens/s | vs torch Schedule1F1B "
        "| peak stashed / rank |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['framework']} | {r['step_s'] * 1e3:.1f} | {r['step_s'] / ideal:.3f}x | "
            f"{tokens / r['step_s']:.0f} | {torch_step / r['step_s']:.2f}x | "
            f"{r['peak'] if r['peak'] is not None else '-'} |"
        )
    lines += [
        "",
        "Executed 1F1B timeline (last timed step):",
        "",
        "```",
        result["text"],
        "```",
        "",
        f"![timeline]({Path(result['png']).name})",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
