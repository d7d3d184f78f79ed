"""Tensor-parallel benchmark on CPU: the bundled GPT (``small``) at TP 2 on 2 processes,
shardwise TP (``shardwise.tensor_parallel``) against torch DTensor TP (``parallelize_module``
with ``ColwiseParallel`` / ``RowwiseParallel``, torchtitan-style), with and without sequence
parallelism, fp32 and bf16 autocast, each over the shardwise backend and over gloo, in the same
processes, taking turns step by step (interleaved rounds, so a slow phase of the VM hits every
run alike). A single-process run of the whole model on 2 threads (the same two cores) is timed
in the same rounds as the "same silicon" reference.

Both frameworks split the same parameters (the embedding and its tied head on the vocabulary
with the vocabulary-parallel loss, in every block the QKV and MLP-up column-wise and the
projection and MLP-down row-wise; norms, position embedding and row biases replicated) and
compute the same FLOPs: the DTensor model's fused QKV rows are permuted to [q_r0, k_r0, v_r0,
q_r1, ...] so that DTensor's contiguous ``Shard(0)`` gives every rank whole heads (shardwise's
``ColwiseParallel(chunks=3)`` does that itself). Step 0's losses are reported beside the
single-process loss as the check that all of them compute the same model.

A step is forward + backward + ``torch.optim.AdamW(foreach=False)``, one thread per rank.
Reported per run: step time (max over ranks per step, then median / p10 / p90 over the timed
rounds), tokens/s (the batch's tokens per step: TP ranks work on the same tokens), the ratio to
DTensor with the same backend and sequence parallelism, parameter bytes per rank against
(split parameters / TP + replicated ones), and the bytes communicated in one step, counted by a
``TorchDispatchMode`` that sees every c10d and functional collective (payload and per-rank ring
traffic), against the Megatron-LM count from the shapes. With ``--two-d`` (on by default) a
second launch runs the 2-D mesh (fsdp x tp = 2 x 2, 4 processes): shardwise TP +
``shardwise.FullyShardedDataParallel`` against torch FSDP2 ``fully_shard`` + DTensor TP.

Run: python benchmarks/bench_tensor_parallel.py \
    --output benchmarks/results/DATE-tensor-parallel-cpu.md
"""

import argparse
import contextlib
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

# Parameters split by both frameworks' plans (suffixes of parameter names); the rest replicated.
SPLIT = (
    "embed.weight",
    "qkv.weight",
    "qkv.bias",
    "proj.weight",
    "up.weight",
    "up.bias",
    "down.weight",
)


def comm_theory(cfg, batch: int, sp: bool, block_bytes: int, tp: int = 2) -> dict:
    """The planner's count (``gpt_costs.gpt_tp_communication_bytes``): the minimum, with
    every gathered activation kept for backward."""
    from shardwise.train.gpt_costs import gpt_tp_communication_bytes

    return gpt_tp_communication_bytes(cfg, batch, sp, block_bytes, tp)


def param_bytes(model) -> int:
    """This rank's parameter bytes (local shards of DTensors, a tied weight once)."""
    seen, total = set(), 0
    for p in model.parameters():
        t = p.to_local() if hasattr(p, "to_local") else p
        if id(p) not in seen:
            seen.add(id(p))
            total += t.numel() * t.element_size()
    return total


def param_theory(model, tp: int) -> dict:
    """(split parameters) / tp + replicated ones, from the whole model, in bytes."""
    split = repl = 0
    for name, p in model.named_parameters():
        n = p.numel() * p.element_size()
        if name.endswith(SPLIT):
            split += n
        else:
            repl += n
    return {"full": split + repl, "split": split, "replicated": repl, "per_rank": split / tp + repl}


def permute_qkv(model, tp: int) -> None:
    """Reorders every block's fused QKV rows [q; k; v] into [q_0, k_0, v_0, q_1, k_1, v_1, ...]
    (r = rank's heads), so a contiguous Shard(0) gives each rank whole heads of q, k and v."""
    import torch

    dim = model.cfg.dim
    index = torch.arange(3 * dim).view(3, tp, dim // tp).transpose(0, 1).reshape(-1)
    with torch.no_grad():
        for block in model.blocks:
            block.qkv.weight.copy_(block.qkv.weight[index])
            block.qkv.bias.copy_(block.qkv.bias[index])


def dtensor_plan(cfg, sp: bool) -> dict:
    """torchtitan's plan, on the GPT's module names: the embedding row-wise (vocabulary) with
    its output replicated (SP: sharded on the sequence), in every block qkv/up colwise and
    proj/down rowwise (SP: SequenceParallel norms, the colwise inputs gathered from Shard(1),
    the rowwise outputs reduce-scattered to Shard(1)), the head colwise with its logits left
    sharded on the vocabulary for ``loss_parallel``. SP also cuts the position embedding's
    output to this rank's positions."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {
        "embed": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate()
        ),
        "head": ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(),
            output_layouts=Shard(-1),
            use_local_output=False,
        ),
    }
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        if sp:
            plan[b + "norm1"] = SequenceParallel()
            plan[b + "norm2"] = SequenceParallel()
            plan[b + "qkv"] = ColwiseParallel(input_layouts=Shard(1))
            plan[b + "up"] = ColwiseParallel(input_layouts=Shard(1))
            plan[b + "proj"] = RowwiseParallel(output_layouts=Shard(1))
            plan[b + "down"] = RowwiseParallel(output_layouts=Shard(1))
        else:
            plan[b + "qkv"] = ColwiseParallel()
            plan[b + "up"] = ColwiseParallel()
            plan[b + "proj"] = RowwiseParallel()
            plan[b + "down"] = RowwiseParallel()
    if sp:
        plan["pos"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Shard(0)
        )
        plan["norm"] = SequenceParallel()
    return plan


def dtensor_tp(model, mesh, sp: bool):
    """The GPT split by DTensor over ``mesh`` (1-D), the head re-tied to the embedding."""
    from torch.distributed.tensor.parallel import parallelize_module

    permute_qkv(model, mesh.size())
    parallelize_module(model, mesh, dtensor_plan(model.cfg, sp))
    model.head.weight = model.embed.weight  # both Shard(0) of the same [vocab, dim]
    return model


def scalar(loss) -> float:
    return (loss.full_tensor() if hasattr(loss, "full_tensor") else loss).item()


class Run:
    """One configuration: its model, optimizer and step (forward, backward, AdamW)."""

    def __init__(self, name, model, *, dtensor, bf16, loss_fn=None, threads=1, ranks=None):
        import torch

        self.name, self.model, self.dtensor, self.bf16 = name, model, dtensor, bf16
        self.loss_fn = loss_fn or model.loss
        self.threads, self.ranks = threads, ranks
        self.opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
        self.times, self.opt_times, self.losses, self.comm = [], [], [], None

    def step(self, x, y):
        import torch
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel() if self.dtensor else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                loss = self.loss_fn(x, y)
            loss.backward()
        start = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.last_opt_s = time.perf_counter() - start
        return scalar(loss)


def timed_rounds(runs, batches, warmup: int, dist, rank) -> None:
    """Every run once per round on the same batch (interleaved); a run with ``ranks`` set runs
    only there while the others wait at the barrier; the first ``args.warmup`` rounds are not
    timed. Each run's step-0 loss is kept, then one more step counts the collectives."""
    import torch

    for k, tokens in enumerate(batches):
        for run in runs:
            dist.barrier()
            if run.ranks is not None and rank not in run.ranks:
                continue
            torch.set_num_threads(run.threads)
            start = time.perf_counter()
            loss = run.step(tokens[:, :-1], tokens[:, 1:])
            elapsed = time.perf_counter() - start
            torch.set_num_threads(1)
            run.losses.append(loss)
            if k >= warmup:
                run.times.append(elapsed)
                run.opt_times.append(run.last_opt_s)
        if rank == 0:
            print(f"round {k + 1}/{len(batches)} done", file=sys.stderr, flush=True)
    from shardwise.comm_count import CommCounter

    for run in runs:
        dist.barrier()
        if run.ranks is not None and rank not in run.ranks:
            continue
        counter = CommCounter(group_size=2)  # every counted group here (tp, fsdp) has 2 ranks
        with counter:
            run.step(batches[0][:, :-1], batches[0][:, 1:])
        run.comm = {"calls": counter.calls, "payload": counter.payload, "wire": counter.wire}


def summarize(runs, dist, steps: int) -> list[dict]:
    """Per run: the max over ranks of each timed step, then median / p10 / p90 (and the median
    of the optimizer's share, max over ranks); the rest from
    rank 0 (TP ranks hold equal shards; a rank-0-only run reports its own)."""
    import torch

    rows = []
    for run in runs:
        t = torch.tensor(
            [run.times or [0.0] * steps, run.opt_times or [0.0] * steps], dtype=torch.float64
        )
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        values = sorted(t[0].tolist())
        q = (
            statistics.quantiles(values, n=10, method="inclusive")
            if len(values) > 1
            else values * 9
        )
        rows.append(
            {
                "name": run.name,
                "step_s": statistics.median(values),
                "p10_s": q[0],
                "p90_s": q[-1],
                "opt_s": statistics.median(t[1].tolist()),
                "param_bytes": param_bytes(run.model),
                "loss0": run.losses[0] if run.losses else None,
                "loss_last": run.losses[-1] if run.losses else None,
                "comm": run.comm,
            }
        )
    return rows


def run_tp(args) -> None:
    """The TP-2 runs on 2 processes (and the single-process reference on rank 0)."""
    import shardwise  # noqa: F401 (registers the backend)
    import shardwise.tensor_parallel as tp
    import torch
    import torch.distributed as dist
    from shardwise.models import GPT, PRESETS
    from torch.distributed.device_mesh import DeviceMesh

    torch.set_num_threads(1)
    dist.init_process_group("shardwise")
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"shardwise": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    cfg = PRESETS[args.model]

    def gpt():
        torch.manual_seed(0)
        return GPT(cfg)

    runs = []
    for dtype in args.dtypes.split(","):
        bf16 = dtype == "bf16"
        reference = f"1 process, 2 threads, {dtype}"
        runs.append(Run(reference, gpt(), dtensor=False, bf16=bf16, threads=2, ranks=(0,)))
        for backend in args.backends.split(","):
            group = groups[backend]
            mesh = DeviceMesh.from_group(group, "cpu")
            for sp in (False, True):
                tag = f"{backend}, {'SP' if sp else 'no SP'}, {dtype}"
                model = tp.parallelize(gpt(), group, tp.gpt_plan(gpt(), sequence_parallel=sp))
                runs.append(Run(f"shardwise TP, {tag}", model, dtensor=False, bf16=bf16))
                if sp:  # the gathered inputs saved for backward, as DTensor saves them
                    plan = tp.gpt_plan(gpt(), sequence_parallel=True, save_gathered=True)
                    model = tp.parallelize(gpt(), group, plan)
                    name = f"shardwise TP (save_gathered), {tag}"
                    runs.append(Run(name, model, dtensor=False, bf16=bf16))
                model = dtensor_tp(gpt(), mesh, sp)
                runs.append(Run(f"DTensor TP, {tag}", model, dtensor=True, bf16=bf16))
    g = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len + 1), generator=g)
        for _ in range(args.warmup + args.steps)
    ]
    timed_rounds(runs, batches, args.warmup, dist, rank)
    rows = summarize(runs, dist, args.steps)
    if rank == 0:
        full = param_theory(gpt(), world)
        print(json.dumps({"rows": rows, "params": full}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run_2d(args) -> None:
    """fsdp x tp = 2 x 2 on 4 processes: shardwise (Mesh, TP, FSDP) over the shardwise backend
    and over gloo, torch FSDP2 + DTensor TP over gloo (and over the shardwise backend)."""
    import shardwise
    import shardwise.tensor_parallel as tp
    import torch
    import torch.distributed as dist
    from shardwise.mesh import Mesh
    from shardwise.models import GPT, PRESETS
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("shardwise")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = PRESETS[args.model]
    mesh = Mesh([[2, 2], ["fsdp", "tp"]])
    layout = torch.arange(world).view(2, 2)  # tp innermost, as shardwise's MeshLayout
    gloo = {}
    for axis, ranks_list in (("tp", layout.tolist()), ("fsdp", layout.t().tolist())):
        for ranks in ranks_list:
            made = dist.new_group(ranks, backend="gloo")
            if rank in ranks:
                gloo[axis] = made
    assert mesh.ranks("tp") == layout[rank // 2].tolist(), mesh.describe()
    assert mesh.ranks("fsdp") == layout[:, rank % 2].tolist(), mesh.describe()
    axis_groups = {
        "shardwise": {"tp": mesh.group("tp"), "fsdp": mesh.group("fsdp")},
        "gloo": gloo,
    }
    d = mesh.coordinate("fsdp")
    names = [f"blocks.{i}" for i in range(cfg.layers)]

    def gpt():
        torch.manual_seed(0)
        return GPT(cfg)

    runs = []
    sp = args.sp_2d
    for dtype in args.dtypes.split(","):
        bf16 = dtype == "bf16"
        for backend in args.backends.split(","):
            tp_group, fsdp_group = axis_groups[backend]["tp"], axis_groups[backend]["fsdp"]
            model = tp.parallelize(gpt(), tp_group, tp.gpt_plan(gpt(), sequence_parallel=sp))
            loss_fn = model.cross_entropy
            wrapped = shardwise.FullyShardedDataParallel(
                model, process_group=fsdp_group, wrap=names
            )
            runs.append(
                Run(
                    f"shardwise TP + shardwise FSDP, {backend}, {dtype}",
                    wrapped,
                    dtensor=False,
                    bf16=bf16,
                    loss_fn=lambda x, y, w=wrapped, f=loss_fn: f(w(x), y),
                )
            )
            if backend not in args.torch_2d_backends.split(","):
                continue
            mesh2 = DeviceMesh.from_group(
                [fsdp_group, tp_group], "cpu", mesh=layout, mesh_dim_names=("fsdp", "tp")
            )
            model = dtensor_tp(gpt(), mesh2["tp"], sp)
            for block in model.blocks:
                fully_shard(block, mesh=mesh2["fsdp"])
            fully_shard(model, mesh=mesh2["fsdp"])
            runs.append(
                Run(f"torch FSDP2 + DTensor TP, {backend}, {dtype}", model, dtensor=True, bf16=bf16)
            )
    g = torch.Generator().manual_seed(1)
    batches = [
        torch.randint(0, cfg.vocab_size, (2 * args.batch, cfg.seq_len + 1), generator=g)
        for _ in range(args.warmup_2d + args.steps_2d)
    ]
    mine = [b[d * args.batch : (d + 1) * args.batch] for b in batches]
    timed_rounds(runs, mine, args.warmup_2d, dist, rank)
    for run in runs:  # the loss is this fsdp replica's: average the two
        for k, value in enumerate(run.losses):
            t = torch.tensor([value], dtype=torch.float64)
            dist.all_reduce(t)
            run.losses[k] = t.item() / world
    rows = summarize(runs, dist, args.steps_2d)
    for run, row in zip(runs, rows, strict=True):
        model = run.model
        if hasattr(model, "memory_bytes"):
            row["param_bytes"] = model.memory_bytes()["parameters"]
    if rank == 0:
        print(json.dumps({"rows": rows, "params": param_theory(gpt(), 2)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def fmt_comm(comm) -> str:
    """'12x all-reduce (3.00 MB), ...': calls and this rank's ring traffic per kind."""
    if not comm:
        return "-"
    parts = [
        f"{comm['calls'][k]}x {k.replace('_', '-')} ({comm['wire'][k] / 2**20:.2f} MB)"
        for k in sorted(comm["calls"])
    ]
    return ", ".join(parts) or "none"


def tp_table(result, args) -> list[str]:
    from shardwise.models import PRESETS

    cfg = PRESETS[args.model]
    tokens = args.batch * cfg.seq_len
    params = result["params"]
    rows = {r["name"]: r for r in result["rows"]}
    lines = [
        "| run | step ms (p10-p90) | of it AdamW ms | tokens/s | vs DTensor, same backend & SP "
        "| vs 1 process 2 threads | param MB/rank (vs theory) | comm MB/step/rank measured "
        "(theory) | collectives per step | loss step 0 | loss last |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name, r in rows.items():
        dtype = name.rsplit(", ", 1)[1]
        ref = rows.get(f"1 process, 2 threads, {dtype}")
        anchor = rows.get(
            name.replace(" (save_gathered)", "").replace("shardwise TP", "DTensor TP")
        )
        sp = ", SP," in name
        tp_run = "TP" in name
        vs_dt = f"{anchor['step_s'] / r['step_s']:.2f}x" if tp_run and anchor else "-"
        vs_ref = f"{ref['step_s'] / r['step_s']:.2f}x" if ref else "-"
        theory_p = params["per_rank"] if tp_run else params["full"]
        pb = f"{r['param_bytes'] / 2**20:.2f} ({(r['param_bytes'] / theory_p - 1) * 100:+.2f}%)"
        if r["comm"] and tp_run:
            wire = sum(r["comm"]["wire"].values())
            th = comm_theory(cfg, args.batch, sp, 2 if dtype == "bf16" else 4)["total"]
            comm = f"{wire / 2**20:.2f} ({th / 2**20:.2f})"
        else:
            comm = "-"
        lines.append(
            f"| {name} | {r['step_s'] * 1e3:.0f} ({r['p10_s'] * 1e3:.0f}-{r['p90_s'] * 1e3:.0f}) "
            f"| {r['opt_s'] * 1e3:.0f} | {tokens / r['step_s']:.0f} | {vs_dt} | {vs_ref} | {pb} "
            f"| {comm} "
            f"| {fmt_comm(r['comm'])} | {r['loss0']:.5f} | {r['loss_last']:.5f} |"
        )
    return lines


def twod_table(result, args) -> list[str]:
    from shardwise.models import PRESETS

    cfg = PRESETS[args.model]
    tokens = 2 * args.batch * cfg.seq_len
    theory = result["params"]["per_rank"] / 2
    rows = {r["name"]: r for r in result["rows"]}
    lines = [
        "| run | step ms (p10-p90) | of it AdamW ms | tokens/s "
        "| vs torch FSDP2 + DTensor, gloo, same dtype "
        "| param MB/rank (vs theory) | comm MB/step/rank measured | collectives per step "
        "| loss step 0 | loss last |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for name, r in rows.items():
        dtype = name.rsplit(", ", 1)[1]
        anchor = rows.get(f"torch FSDP2 + DTensor TP, gloo, {dtype}")
        vs = f"{anchor['step_s'] / r['step_s']:.2f}x" if anchor else "-"
        wire = sum(r["comm"]["wire"].values()) if r["comm"] else 0
        pb = f"{r['param_bytes'] / 2**20:.2f} ({(r['param_bytes'] / theory - 1) * 100:+.2f}%)"
        lines.append(
            f"| {name} | {r['step_s'] * 1e3:.0f} ({r['p10_s'] * 1e3:.0f}-{r['p90_s'] * 1e3:.0f}) "
            f"| {r['opt_s'] * 1e3:.0f} | {tokens / r['step_s']:.0f} | {vs} | {pb} "
            f"| {wire / 2**20:.2f} "
            f"| {fmt_comm(r['comm'])} | {r['loss0']:.5f} | {r['loss_last']:.5f} |"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--batch", type=int, default=2, help="sequences per step (per replica)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--backends", default="shardwise,gloo")
    parser.add_argument(
        "--two-d", action=argparse.BooleanOptionalAction, default=True, help="the 2-D run"
    )
    parser.add_argument("--steps-2d", type=int, default=5)
    parser.add_argument("--warmup-2d", type=int, default=1)
    parser.add_argument("--sp-2d", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--torch-2d-backends", default="gloo,shardwise")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of == "tp":
        run_tp(args)
        return 0
    if args.rank_of == "2d":
        run_2d(args)
        return 0
    import torch
    from shardwise.models import PRESETS

    cfg = PRESETS[args.model]
    start = time.perf_counter()
    args.world = 2
    result = launch_ranks("tp", args, __file__)
    tp_s = time.perf_counter() - start
    result_2d = None
    if args.two_d:
        args.world = 4
        result_2d = launch_ranks("2d", args, __file__)
    total_s = time.perf_counter() - start
    params = result["params"]
    lines = [
        f"# Tensor parallelism on CPU: shardwise TP vs torch DTensor TP ({datetime.date.today()})",
        "",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"torch {torch.__version__}",
        f"- command: `python benchmarks/bench_tensor_parallel.py {' '.join(sys.argv[1:])}`",
        f"- model: GPT `{args.model}` ({params['full'] / 4 / 1e6:.1f}M parameters, dim "
        f"{cfg.dim}, {cfg.layers} layers, {cfg.heads} heads, vocabulary {cfg.vocab_size}, "
        f"sequence {cfg.seq_len}); batch {args.batch} x {cfg.seq_len} tokens per step; TP 2 on "
        f"2 processes, 1 thread each (OMP_NUM_THREADS=1); AdamW (foreach=False); "
        f"{args.steps} timed rounds after {args.warmup}, every run once per round (interleaved)",
        "- step ms: max over ranks per step, median (p10-p90) over the rounds; tokens/s: the "
        "batch's tokens per step time (the TP ranks share the tokens)",
        "- both frameworks split the same parameters: token embedding = tied head on the "
        "vocabulary (vocabulary-parallel loss: shardwise `LossParallel`, DTensor "
        "`loss_parallel()`), qkv and up column-wise (DTensor's qkv rows permuted so Shard(0) "
        "gives whole heads), proj and down row-wise; replicated: position embedding, norms, "
        "proj/down biases. SP: norms on this rank's tokens (DTensor `SequenceParallel`), the "
        "position embedding's output cut to this rank's positions",
        f"- parameter theory per rank: split {params['split'] / 2**20:.2f} MB / 2 + replicated "
        f"{params['replicated'] / 2**20:.2f} MB = {params['per_rank'] / 2**20:.2f} MB "
        f"(full model {params['full'] / 2**20:.2f} MB)",
        "- comm: one extra step per run under a TorchDispatchMode that counts every c10d / "
        "functional collective (DTensor's inner ones too); MB = this rank's ring traffic "
        "(all-reduce 2(p-1)/p, all-gather / reduce-scatter (p-1)/p of the payload); theory: "
        "the minimum Megatron-LM count from the shapes (see `comm_theory`; SP: gathered "
        "activations kept for backward), activations in the autocast dtype inside the blocks "
        "and fp32 at the embedding",
        f"- wall time: TP launch {tp_s:.0f} s, total {total_s:.0f} s",
        "",
        "## TP 2, 2 processes",
        "",
    ]
    lines += tp_table(result, args)
    if result_2d:
        lines += [
            "",
            f"## 2-D: fsdp x tp = 2 x 2, 4 processes on {os.cpu_count()} cores",
            "",
            f"- global batch {2 * args.batch} x {cfg.seq_len} tokens ({args.batch} sequences "
            f"per fsdp replica), sequence parallel {'on' if args.sp_2d else 'off'}; shardwise: "
            "`Mesh([[2, 2], ['fsdp', 'tp']])`, `tp.parallelize` on the tp group, "
            "`FullyShardedDataParallel(process_group=fsdp group, wrap=blocks)` (gloo rows: the "
            "same groups made with backend gloo); torch: the DTensor plan above on "
            "`DeviceMesh.from_group([fsdp, tp])['tp']`, then `fully_shard` per block and on "
            "the root over the fsdp dimension; "
            f"{args.steps_2d} timed rounds after {args.warmup_2d}",
            f"- param theory per rank: {params['per_rank'] / 2 / 2**20:.2f} MB (TP theory / 2)",
            "",
        ]
        lines += twod_table(result_2d, args)
    else:
        lines += ["", "2-D run skipped (--no-two-d)."]
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
