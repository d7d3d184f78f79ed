"""Pipeline benchmark on CPU: the bundled GPT (``small``) cut into p = 2 stages on 2 processes,
m = 8 microbatches, bf16 autocast. Reported in the same run, for two ways of cutting the model
(the even block split a torch user writes, and shardwise's split_by_time over half-blocks):

- shardwise 1F1B, ZB-H1 (weight gradients deferred) and GPipe step times beside the ideal (the
  slower stage's measured forward + backward time per microbatch × (m + p - 1)), and the peak
  number of stashed microbatch-stages per rank;
- torch.distributed.pipelining ``Schedule1F1B`` on the same stages and process group.

The GPT's tied head is untied for both (a copy on the last stage). Each timed step is the max
over ranks, median of the timed steps; the runs take turns step by step (interleaved rounds),
so a slow phase of the VM hits them alike.

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
from report import emit


class Stage:
    """Factory of one rank's stage module: a run of GPT sublayers under bf16 autocast whose
    output crosses to the next stage in fp32 (for both frameworks alike)."""

    @staticmethod
    def make(blocks, group):
        import torch
        from torch import nn

        class PipelineStage(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Sequential(*(blocks[i] for i in group))

            def forward(self, x):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return self.body(x).float()

        return PipelineStage()


def loss_fn(logits, targets):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def splits(blocks, cfg, args, dist):
    """The two ways of cutting the GPT into 2 stages: "even" (embedding and the first half of
    the transformer blocks | the rest and the head: what a torch.distributed.pipelining user
    writes by hand) and "balanced" (shardwise.pipeline.split_by_time over attention/MLP halves,
    with the loss on the head, refined by timing whole stages; rank 0 times while the others
    wait, then broadcasts). Also the per-sublayer costs rank 0 measured, for the report."""
    import shardwise.pipeline as pp
    import torch

    n = len(blocks)  # embedding, 2 halves per transformer block, head
    even_cut = 1 + cfg.layers  # = 1 + 2 * (layers // 2) halves
    balanced = costs = None
    if dist.get_rank() == 0:
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, cfg.vocab_size, (args.micro, cfg.seq_len + 1), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            costs = pp.block_times(blocks, tokens[:, :-1], 5, loss_fn, tokens[:, 1:])
            balanced = pp.split_by_time(
                blocks, args.world, tokens[:, :-1], 5, loss_fn, tokens[:, 1:]
            )
    box = [balanced, costs]
    dist.broadcast_object_list(box, src=0)
    balanced, costs = box
    return {"even": [list(range(0, even_cut)), list(range(even_cut, n))], "balanced": balanced}, (
        costs
    )


def step_ideal(actions, times, m: int, p: int) -> dict:
    """From one executed step: its makespan and the ideal for it, the busiest rank's compute
    (its F/B/I/W action times, measured in that very step) × (m + p − 1) / m."""
    busy = [
        sum(end - start for name, (start, end) in zip(names, ts, strict=True) if name[0] in "FBIW")
        for names, ts in zip(actions, times, strict=True)
    ]
    makespan = max(t[-1][1] for t in times if t)
    return {"makespan_s": makespan, "ideal_s": max(busy) * (m + p - 1) / m}


def run_rank(args) -> None:
    import shardwise.pipeline as pp
    import torch
    import torch.distributed as dist
    from shardwise.models import GPT, PRESETS
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.set_num_threads(1)
    dist.init_process_group("shardwise")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PRESETS[args.model]
    torch.manual_seed(0)
    blocks, _ = pp.gpt_blocks(GPT(cfg), sublayers=True)  # the head is an untied copy
    groups, costs = splits(blocks, cfg, args, dist)
    m = args.microbatches
    g = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, cfg.vocab_size, (m * args.micro, cfg.seq_len + 1), generator=g)
        for _ in range(args.warmup + args.steps)
    ]
    runs, pipes, modules = {}, {}, {}
    for split, group in groups.items():
        base = Stage.make(blocks, group[rank])
        for kind in ("1f1b", "zb_h1", "gpipe"):
            if kind == "gpipe" and split != "even":
                continue
            stage = copy.deepcopy(base)
            if kind == "zb_h1":
                pp.defer_weight_gradients(stage)
            name = f"shardwise {kind}, {split} split"
            pipes[name] = pp.Pipeline({rank: stage}, pp.make_schedule(kind, world, m), loss_fn)
            modules[name] = stage
            runs[name] = lambda t, p=pipes[name]: p.step(t[:, :-1], t[:, 1:])
        torch_module = copy.deepcopy(base)
        schedule = Schedule1F1B(
            PipelineStage(torch_module, rank, world, torch.device("cpu")),
            n_microbatches=m,
            loss_fn=loss_fn,
        )
        name = f"torch Schedule1F1B, {split} split"
        modules[name] = torch_module

        def torch_step(tokens, schedule=schedule):
            if rank == 0:
                schedule.step(tokens[:, :-1])
            else:
                schedule.step(target=tokens[:, 1:])

        runs[name] = torch_step
    # Interleaved rounds (every run once per round, same batch), so drift on the VM hits all
    # alike; the first rounds are warm-up.
    times = {name: [] for name in runs}
    for k, tokens in enumerate(batches):
        for name, run in runs.items():
            dist.barrier()
            start = time.perf_counter()
            run(tokens)
            modules[name].zero_grad()
            if k >= args.warmup:
                times[name].append(time.perf_counter() - start)
    rows = []
    for name, values in times.items():
        t = torch.tensor([statistics.median(values)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        peak = None
        if name in pipes:
            peak_t = torch.tensor([pipes[name].last["peak_stashed"]])
            dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
            peak = int(peak_t.item())
        rows.append({"framework": name, "step_s": t.item(), "peak": peak})
    pictures, in_step = {}, {}
    for name, pipe in pipes.items():  # the last timed step of every shardwise run
        actions, measured = pipe.gather_times()
        pictures[name] = (actions, measured)
        in_step[name] = step_ideal(actions, measured, m, world)
    # The ideal per split: the slower stage's forward + backward per microbatch, each stage
    # timed whole on rank 0 (the fastest of 5, bf16 autocast, as in the runs) × (m + p − 1).
    ideal = {}
    for split, stage_groups in groups.items():
        stage_s = 0.0
        if rank == 0:
            g = torch.Generator().manual_seed(0)
            tokens = torch.randint(0, cfg.vocab_size, (args.micro, cfg.seq_len + 1), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                stage_s = max(
                    pp.group_times(blocks, stage_groups, tokens[:, :-1], 5, loss_fn, tokens[:, 1:])
                )
        box = [stage_s]
        dist.broadcast_object_list(box, src=0)
        ideal[split] = {"stage_s": box[0], "ideal_s": box[0] * (m + world - 1)}
    if rank == 0:
        from shardwise.pipeline import timeline

        name = "shardwise zb_h1, balanced split"
        print(
            json.dumps(
                {
                    "rows": rows,
                    "ideal": ideal,
                    "groups": groups,
                    "costs": costs,
                    "in_step": in_step,
                    "text": {
                        n: timeline.render_text(*pictures[n])
                        for n in ("shardwise 1f1b, even split", "shardwise zb_h1, balanced split")
                    },
                    "png": str(
                        timeline.plot(*pictures[name], args.png, f"{name}, p={world}, m={m}:")
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
    import torch
    from shardwise.models import PRESETS

    rows = {r["framework"]: r for r in result["rows"]}
    anchor = rows["torch Schedule1F1B, even split"]["step_s"]
    same_split_anchor = {
        split: rows[f"torch Schedule1F1B, {split} split"]["step_s"] for split in result["ideal"]
    }
    tokens = args.microbatches * args.micro * PRESETS[args.model].seq_len
    names = ["embedding"] + [
        f"{half}{k}" for k in range(PRESETS[args.model].layers) for half in ("attn", "mlp")
    ]
    names.append("head+loss")

    def describe(group):
        return f"{names[group[0]]} … {names[group[-1]]}"

    lines = [
        f"# Pipeline on CPU: shardwise schedules vs torch.distributed.pipelining "
        f"({datetime.date.today()})",
        "",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"torch {torch.__version__}; backend shardwise for both frameworks",
        f"- command: `python benchmarks/bench_pipeline.py {' '.join(sys.argv[1:])}`",
        f"- GPT `{args.model}` in {args.world} stages, m = {args.microbatches} microbatches of "
        f"{args.micro} sequence(s), bf16 autocast; median of {args.steps} timed steps after "
        f"{args.warmup}, every run once per round (interleaved)",
        "- splits: **even** = embedding + the first half of the transformer blocks | the rest + "
        "head (what a torch.distributed.pipelining user writes by hand); **balanced** = "
        "`split_by_time` over attention/MLP halves with the loss on the head, refined by timing "
        "whole stages (shardwise's splitter)",
    ]
    for split, groups in result["groups"].items():
        ideal = result["ideal"][split]
        lines.append(
            f"- {split}: stages [{'] ['.join(describe(g) for g in groups)}]; slower stage alone: "
            f"forward + backward per microbatch {ideal['stage_s'] * 1e3:.1f} ms; ideal step = "
            f"that × (m + p − 1) = {ideal['ideal_s'] * 1e3:.1f} ms"
        )
    lines += [
        "- per-sublayer forward + backward ms (rank 0, fastest of 5, before the runs): "
        + ", ".join(f"{n} {c * 1e3:.1f}" for n, c in zip(names, result["costs"], strict=True)),
        "",
        "| run | step ms | vs ideal (stages timed alone) | vs ideal (compute in the step) "
        "| tokens/s | vs torch Schedule1F1B (even) | vs torch Schedule1F1B, same split "
        "| peak stashed / rank |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        split = name.rsplit(", ", 1)[1].split()[0]
        own = result["in_step"].get(name)
        in_step = f"{own['makespan_s'] / own['ideal_s']:.3f}x" if own else "-"
        lines.append(
            f"| {name} | {r['step_s'] * 1e3:.1f} | "
            f"{r['step_s'] / result['ideal'][split]['ideal_s']:.3f}x | {in_step} | "
            f"{tokens / r['step_s']:.0f} | {anchor / r['step_s']:.2f}x | "
            f"{same_split_anchor[split] / r['step_s']:.2f}x | "
            f"{r['peak'] if r['peak'] is not None else '-'} |"
        )
    for name, text in result["text"].items():
        lines += ["", f"Executed timeline, {name} (last timed step):", "", "```", text, "```"]
    lines += ["", f"![timeline]({Path(result['png']).name})"]
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
