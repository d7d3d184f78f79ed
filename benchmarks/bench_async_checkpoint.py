"""How long a checkpoint blocks training: shardwise-train's synchronous save, its asynchronous
save (``training.checkpoint.async``), and torch.distributed.checkpoint's ``save`` and
``async_save`` (the anchor) on the same state, at world 2, interleaved round by round in the
same processes.

The state is what a sharded GPT run checkpoints per rank: this rank's half of every parameter
and of its two AdamW moments (fp32), as the trainer's world-size-independent pieces for
shardwise (``shardwise.pieces.to_pieces``, built inside the timed call as the trainer builds
them: copied for the synchronous save, views the asynchronous writer copies to host memory)
and as one tensor per piece, keyed by rank, for DCP (each rank writes its own, as under FSDP).
Both write to the same disk and fsync (shardwise: every file, then the manifest with every
file's SHA-256, which DCP does not compute; DCP's FileSystemWriter: ``sync_files=True``, its
default).

Reported per save (median over the rounds, the slower rank's): **blocked**, the seconds until
the call returns and training could go on (asynchronous: the copy to host memory and the
start of the writer), and **durable**, the seconds until the checkpoint is complete on disk
(asynchronous: until the writer is joined / DCP's future has its result).

Run: python benchmarks/bench_async_checkpoint.py --model small \
        --output benchmarks/results/DATE-async-checkpoint-cpu.md
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_fsdp import launch
from report import emit

SAVES = ("shardwise-sync", "shardwise-async", "dcp-sync", "dcp-async")


def state(model_name: str, rank: int, world: int):
    """This rank's pieces of the GPT's parameters and AdamW moments (rank's half of each)."""
    import torch
    from shardwise.models import GPT, PRESETS

    torch.manual_seed(0)
    pieces = {}
    for name, p in GPT(PRESETS[model_name]).named_parameters():
        flat = p.detach().reshape(-1)
        size = -(-flat.numel() // world)
        start = min(rank * size, flat.numel())
        piece = flat[start : start + size]
        for kind, values in (("", piece), (":exp_avg", torch.randn_like(piece)),
                             (":exp_avg_sq", torch.rand_like(piece))):  # fmt: skip
            pieces[(name + kind, start)] = values.clone()
    return pieces


def run_rank(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from shardwise.pieces import Slot, to_pieces
    from shardwise.train import checkpoint as ckpt
    from shardwise.train.async_checkpoint import AsyncSaver

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pieces = state(args.model, rank, world)
    slots = [Slot(n, s, v) for (n, s), v in pieces.items()]

    def payload(copy: bool) -> dict:
        """As the trainer builds it: copies for the synchronous save, views for the
        asynchronous one (whose writer copies them to host memory)."""
        return {"pieces": to_pieces(slots, copy=copy), "step": 1, "rng": torch.get_rng_state()}

    dcp_state = {f"{n}@{s}#rank{rank}": v for (n, s), v in pieces.items()}
    saver = AsyncSaver()
    root = Path(args.dir)
    timings = {name: {"blocked": [], "durable": []} for name in SAVES}

    def timed(name, start_save, finish=None):
        where = root / f"{name}-{len(timings[name]['blocked'])}"
        dist.barrier()
        start = time.perf_counter()
        handle = start_save(where)
        blocked = time.perf_counter() - start
        if finish is not None:
            finish(handle)
        durable = time.perf_counter() - start
        dist.barrier()
        timings[name]["blocked"].append(blocked)
        timings[name]["durable"].append(durable)
        if rank == 0:
            shutil.rmtree(where, ignore_errors=True)

    for _ in range(args.rounds):
        timed("shardwise-sync",
              lambda d: ckpt.save(d, 1, payload(True), rank, world, "", None))  # fmt: skip
        timed("shardwise-async",
              lambda d: saver.save(d, 1, payload(False), rank, world, "", None),
              lambda _: saver.wait())  # fmt: skip
        timed("dcp-sync", lambda d: dcp.save(dcp_state, checkpoint_id=str(d)))
        timed("dcp-async", lambda d: dcp.async_save(dcp_state, checkpoint_id=str(d)),
              lambda future: future.result())  # fmt: skip
    mine = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in timings.items()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        slowest = {n: {k: max(r[n][k] for r in everyone) for k in ("blocked", "durable")}
                   for n in SAVES}  # fmt: skip
        nbytes = sum(v.numel() * v.element_size() for v in pieces.values())
        print(json.dumps({"saves": slowest, "bytes_per_rank": nbytes}), flush=True)
    dist.destroy_process_group()


def cpu_model() -> str:
    import torch
    from shardwise.train.device_check import describe

    return describe(torch.device("cpu"))["name"]


def table(result: dict, args) -> list[str]:
    saves = result["saves"]
    sync = saves["shardwise-sync"]["durable"]
    lines = [
        f"# Checkpoint blocking time, GPT `{args.model}`, world {args.world} "
        f"({datetime.date.today()})",
        "",
        f"{cpu_model()}, {os.cpu_count()} cores; "
        f"{result['bytes_per_rank'] / 2**20:.0f} MiB per rank (its half of the parameters and "
        f"AdamW moments, fp32), written and fsynced to local disk; median of {args.rounds} "
        "interleaved rounds, the slower rank.",
        "",
        "| save | blocked s | durable s | blocked / shardwise sync save |",
        "|---|---:|---:|---:|",
    ]
    for name in SAVES:
        s = saves[name]
        lines.append(f"| {name} | {s['blocked']:.3f} | {s['durable']:.3f} | "
                     f"{s['blocked'] / sync:.1%} |")  # fmt: skip
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (a disk folder)")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        run_rank(args)
        return 0
    made = args.dir is None
    if made:
        args.dir = tempfile.mkdtemp(prefix="bench-ckpt-", dir="/var/tmp")
        sys.argv += ["--dir", args.dir]
    try:
        result = launch("all", args, __file__)
    finally:
        if made:
            shutil.rmtree(args.dir, ignore_errors=True)
    emit(table(result, args), args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
