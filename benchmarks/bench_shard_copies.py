"""The fused sharding copies (csrc/sharding/) beside the torch code they replace, on the
parameter list of the bundled GPT, in GB/s (bytes read + written per second), same run.

  all-gather copy-in   fp32 pieces -> bf16 shard   torch (FSDP2): per-piece .to(bf16), then
                                                   _foreach_copy_ into a fresh buffer
  all-gather copy-out  bf16 gathered -> params     torch (FSDP2): split_with_sizes_copy
  reduce-scatter in    bf16 grads -> fp32 buffer   torch (FSDP2): _chunk_cat into a fresh buffer
                                                   (it pads and widens; FSDP2 then reduces with
                                                   AVG, so no scale pass; ours pre-divides)
  reduce-scatter out   fp32 shard -> grads +=      torch: _foreach_add_ with alpha=scale

The torch columns run the calls FSDP2 makes (torch/distributed/fsdp/_fully_shard/
_fsdp_collectives.py), whose layout pads to a multiple of the world size instead of 16
elements; each shardwise result is first checked bit for bit against a torch reference of our
own layout (pad + cat + .to()).

On ``--device cuda`` every tensor is made on the GPU (torch's default device) and each timing
synchronizes the device.

Run: python benchmarks/bench_shard_copies.py --output benchmarks/results/DATE-shard-copies-cpu.md
     python benchmarks/bench_shard_copies.py --device cuda --output DATE-shard-copies-gpu.md
"""

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import shardwise
import torch
import torch.nn.functional as F
from report import emit
from shardwise.models import GPT, PRESETS
from shardwise.ops import sharding as ops


def sync() -> None:
    if torch.get_default_device().type == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeat: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def cases(numels, world, rank):
    full32 = [torch.randn(n) for n in numels]
    chunks = [ops.chunk(n, world) for n in numels]
    pieces = [
        F.pad(p, (0, c * world - p.numel()))[
            rank * c : rank * c + ops.valid(p.numel(), world, rank)
        ]
        for p, c in zip(full32, chunks, strict=True)
    ]
    shard_n = sum(chunks)
    gathered = torch.randn(shard_n * world).to(torch.bfloat16)
    grads16 = [torch.randn(n).to(torch.bfloat16) for n in numels]
    reduced = torch.randn(shard_n)
    shard_grads = [torch.zeros(p.numel()) for p in pieces]
    scale = 0.5

    def ag_in_reference():
        padded = [F.pad(p, (0, c - p.numel())) for p, c in zip(pieces, chunks, strict=True)]
        return torch.cat(padded).to(torch.bfloat16)

    def ag_in_torch():
        inputs = [p.to(torch.bfloat16) for p in pieces]
        out = torch.empty(sum(p.numel() for p in pieces), dtype=torch.bfloat16)
        torch._foreach_copy_(list(torch.split(out, [p.numel() for p in pieces])), inputs)
        return out

    def ag_in_ours():
        return ops.all_gather_copy_in(pieces, numels, world, rank, torch.bfloat16)

    outs_torch = [torch.empty(world, c, dtype=torch.bfloat16) for c in chunks]
    outs_ours = [torch.empty(n, dtype=torch.bfloat16) for n in numels]

    def ag_out_torch():
        torch.split_with_sizes_copy(gathered.view(world, -1), chunks, dim=1, out=outs_torch)
        return outs_torch

    def ag_out_ours():
        ops.all_gather_copy_out_(gathered, numels, world, outs_ours)
        return outs_ours

    def rs_in_reference():
        padded = [
            F.pad(g, (0, c * world - g.numel())) for g, c in zip(grads16, chunks, strict=True)
        ]
        out = torch.empty(world, shard_n, dtype=torch.float32)
        torch._chunk_cat(padded, dim=0, num_chunks=world, out=out)
        return out.view(-1).mul_(scale)

    fsdp2_row = sum(-(-g.numel() // world) for g in grads16)

    def rs_in_torch():
        out = torch.empty(world, fsdp2_row, dtype=torch.float32)
        torch._chunk_cat(grads16, dim=0, num_chunks=world, out=out)
        return out

    def rs_in_ours():
        return ops.reduce_scatter_copy_in(grads16, numels, world, torch.float32, scale)

    # The engines' own buffers: FSDP2 allocates the reduce-scatter input afresh every step (on
    # CPU a fresh 186 MB tensor is page-faulted in on first touch); shardwise's engine rotates
    # two reused buffers (csrc/fsdp/fsdp_engine.h), so its copy-in writes into warm memory.
    reused_torch = torch.empty(world, fsdp2_row, dtype=torch.float32)
    reused_ours = torch.empty(shard_n * world, dtype=torch.float32)

    def rs_in_torch_reused():
        torch._chunk_cat(grads16, dim=0, num_chunks=world, out=reused_torch)

    def rs_in_ours_reused():
        ops.reduce_scatter_copy_in_(grads16, numels, world, scale, reused_ours)

    offsets = [sum(chunks[:i]) for i in range(len(chunks))]
    views = [reduced[o : o + g.numel()] for o, g in zip(offsets, shard_grads, strict=True)]

    def rs_out_torch():
        torch._foreach_add_(shard_grads, views, alpha=scale)

    def rs_out_ours():
        ops.reduce_scatter_copy_out_(reduced, numels, world, rank, scale, shard_grads)

    # First accumulation step (no gradient yet). FSDP2 makes the gradients views of its fresh
    # reduce-scatter output (no copy; the buffer's first touch is paid in the reduce-scatter);
    # shardwise keeps stable gradient shards and overwrites them in one pass. The torch column is
    # the one-pass torch equivalent, torch.mul(out=) into the existing shards.
    def rs_out_fresh_torch():
        for grad, view in zip(shard_grads, views, strict=True):
            torch.mul(view, scale, out=grad)

    def rs_out_fresh_ours():
        ops.reduce_scatter_copy_out_(reduced, numels, world, rank, scale, shard_grads, False)

    valid_total = sum(p.numel() for p in pieces)
    total = sum(numels)
    return [
        ("all-gather copy-in", ag_in_torch, ag_in_ours, valid_total * 4 + shard_n * 2),
        ("all-gather copy-out", ag_out_torch, ag_out_ours, total * 2 * 2),
        ("reduce-scatter copy-in", rs_in_torch, rs_in_ours, total * 2 + shard_n * world * 4),
        (
            "reduce-scatter copy-in, reused output",
            rs_in_torch_reused,
            rs_in_ours_reused,
            total * 2 + shard_n * world * 4,
        ),
        (
            "reduce-scatter copy-in, as each engine runs it (FSDP2 fresh, shardwise reused)",
            rs_in_torch,
            rs_in_ours_reused,
            total * 2 + shard_n * world * 4,
        ),
        ("reduce-scatter copy-out (accumulate)", rs_out_torch, rs_out_ours, valid_total * 4 * 3),
        (
            "reduce-scatter copy-out (first step: zero + accumulate vs overwrite)",
            rs_out_fresh_torch,
            rs_out_fresh_ours,
            valid_total * 4 * 2,
        ),
    ], (ag_in_reference, ag_in_ours, rs_in_reference, rs_in_ours, ag_out_torch, ag_out_ours, numels)


def memcpy_roofline(nbytes: int, repeat: int) -> float:
    """Seconds for one copy_ that reads nbytes / 2 and writes nbytes / 2: the same traffic."""
    src = torch.ones(nbytes // 2, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return timed(lambda: dst.copy_(src), repeat)


def check(refs) -> None:
    ag_in_torch, ag_in_ours, rs_in_torch, rs_in_ours, ag_out_torch, ag_out_ours, numels = refs
    assert torch.equal(ag_in_torch(), ag_in_ours()), "all-gather copy-in differs from torch"
    assert torch.equal(rs_in_torch(), rs_in_ours()), "reduce-scatter copy-in differs from torch"
    for t, o, n in zip(ag_out_torch(), ag_out_ours(), numels, strict=True):
        assert torch.equal(t.view(-1)[:n], o), "all-gather copy-out differs from torch"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    torch.set_num_threads(args.threads)
    numels = [p.numel() for p in GPT(PRESETS[args.model]).parameters()]
    torch.set_default_device(args.device)
    rows, refs = cases(numels, args.world, rank=0)
    check(refs)
    gpu = f"{torch.cuda.get_device_name()} on " if args.device == "cuda" else ""
    lines = [
        f"# Fused sharding copies vs torch on {args.device} ({datetime.date.today()})",
        "",
        f"- machine: {gpu}{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{args.threads} thread(s); torch {torch.__version__}; shardwise CPU ISA "
        f"{shardwise.active_cpu_isa()}",
        f"- command: `python benchmarks/bench_shard_copies.py {' '.join(sys.argv[1:])}`",
        f"- parameters of GPT `{args.model}` ({len(numels)} tensors, {sum(numels) / 1e6:.1f}M "
        f"elements), world {args.world}, rank 0; best of {args.repeat}",
        "",
        "| copy | torch ms | torch GB/s | shardwise ms | shardwise GB/s | speed-up "
        "| memcpy GB/s, same bytes |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, torch_fn, ours_fn, nbytes in rows:
        t, o = timed(torch_fn, args.repeat), timed(ours_fn, args.repeat)
        m = memcpy_roofline(nbytes, args.repeat)
        lines.append(
            f"| {name} | {t * 1e3:.2f} | {nbytes / t / 1e9:.2f} | {o * 1e3:.2f} | "
            f"{nbytes / o / 1e9:.2f} | {t / o:.2f}x | {nbytes / m / 1e9:.2f} |"
        )
    emit(lines, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
