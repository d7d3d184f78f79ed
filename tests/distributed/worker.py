"""One rank of a distributed test world (started by launcher.py). Runs every check of a scenario
over the `shardwise` backend, comparing with gloo on the same inputs (the ops, faults and debug
scenarios) or with single-process training (fsdp, zero, pipeline, tensor_parallel), and writes
{check: "ok" | error text} to OUT/rank<R>.json."""

import datetime
import json
import os
import re
import socket
import sys
import time
import traceback
from pathlib import Path

import conformance_checks
import debug_checks
import fsdp_checks
import pipeline_checks
import shardwise  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist
import tp_checks
import zero_checks
import zeropp_checks

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
]
OPS = {
    "SUM": dist.ReduceOp.SUM,
    "AVG": dist.ReduceOp.AVG,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
}


def rank_input(rank: int, numel: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    """Integer-valued data unique per rank and element, small enough that every reduction is
    exact in every dtype (products use values in {1, 2})."""
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    high = 3 if op == "PRODUCT" else 20
    low = 1 if op == "PRODUCT" or dtype == torch.uint8 else -20
    return torch.randint(low, high, (numel,), generator=g).to(dtype)


def reference(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The exact reduction, in float64/int64 (or logical for bool), in rank order."""
    if inputs[0].dtype == torch.bool:
        stack = torch.stack(inputs)
        return stack.any(0) if op in ("SUM", "MAX") else stack.all(0)
    wide = torch.stack([t.double() if t.is_floating_point() else t.long() for t in inputs])
    result = {
        "SUM": wide.sum(0),
        "AVG": wide.sum(0) / len(inputs),
        "PRODUCT": wide.prod(0),
        "MIN": wide.min(0).values,
        "MAX": wide.max(0).values,
    }[op]
    return result.to(inputs[0].dtype)


def check_all_reduce_every_dtype_and_op(rank, world, gloo):
    """Catches: a wrong reduce kernel, dtype mapping or 16-bit widening for any dtype/op pair."""
    for dtype in DTYPES:
        for name, op in OPS.items():
            if name == "AVG" and not dtype.is_floating_point:
                continue
            for numel in (1, 7, 1000, 70_001):
                x = rank_input(rank, numel, dtype, name)
                expected = reference(
                    [rank_input(r, numel, dtype, name) for r in range(world)], name
                )
                dist.all_reduce(x, op=op)
                assert torch.equal(x, expected), f"{dtype} {name} numel={numel}"
    x = torch.arange(100_000, dtype=torch.float32) + rank  # the same through gloo, bit for bit
    y = x.clone()
    dist.all_reduce(x)
    dist.all_reduce(y, group=gloo)
    assert torch.equal(x, y)


def check_avg_rejects_integers_before_communicating(rank, world, gloo):
    """Catches: an integer AVG silently truncating, or an error raised only on some ranks."""
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG)
    except ValueError as e:
        assert "AVG" in str(e) and "floating" in str(e), str(e)
    else:
        raise AssertionError("no error")
    t = torch.ones(2)
    dist.all_reduce(t)  # the group still works
    assert torch.equal(t, torch.full((2,), float(world)))


def check_gather_scatter_family_matches_gloo(rank, world, gloo):
    """Catches: wrong block placement in all_gather/reduce_scatter (tensor and list forms),
    broadcast from a non-zero root, gather/scatter/reduce roots."""
    for numel in (0, 1, 5, 300_001):
        x = torch.arange(numel, dtype=torch.float32) * (rank + 1)
        outs = {}
        for name, group in (("shardwise", None), ("gloo", gloo)):
            out = torch.empty(world * numel)
            dist.all_gather_into_tensor(out, x, group=group)
            lst = [torch.empty(numel) for _ in range(world)]
            dist.all_gather(lst, x, group=group)
            rs = torch.empty(numel)
            dist.reduce_scatter_tensor(rs, torch.cat([x + r for r in range(world)]), group=group)
            rs_list = torch.empty(numel)
            if name == "shardwise":  # gloo has no list reduce_scatter
                dist.reduce_scatter(rs_list, [x + r for r in range(world)], group=group)
            b = x.clone() if rank == world - 1 else torch.zeros(numel)
            dist.broadcast(b, src=world - 1, group=group)
            outs[name] = (out, torch.cat(lst) if numel else out, rs, b, rs_list)
        for a, b in zip(outs["shardwise"][:4], outs["gloo"][:4], strict=True):
            assert torch.equal(a, b), f"numel={numel}"
        assert torch.equal(outs["shardwise"][4], outs["shardwise"][2])
    t = torch.full((4,), float(rank))
    dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
    if rank == 1:
        assert torch.equal(t, torch.full((4,), float(world - 1)))
    gathered = [torch.empty(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), gathered, dst=0)
    if rank == 0:
        assert [g[0].item() for g in gathered] == list(range(world))
    piece = torch.empty(3)
    chunks = [torch.full((3,), float(r * 10)) for r in range(world)] if rank == world - 1 else None
    dist.scatter(piece, chunks, src=world - 1)
    assert torch.equal(piece, torch.full((3,), float(rank * 10)))


def check_all_to_all_even_uneven_and_list(rank, world, gloo):
    """Catches: wrong split offsets, uneven split sizes, the list form's copy-out."""
    x = torch.arange(world * 3, dtype=torch.float32) + 100 * rank
    out, ref = torch.empty_like(x), torch.empty_like(x)
    dist.all_to_all_single(out, x)
    dist.all_to_all_single(ref, x, group=gloo)
    assert torch.equal(out, ref)
    in_splits = [r + 1 for r in range(world)]  # rank sends r + 1 rows to rank r
    out_splits = [rank + 1] * world
    x = torch.arange(sum(in_splits) * 2, dtype=torch.float32).view(-1, 2) + 1000 * rank
    out = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, x, out_splits, in_splits)
    for src in range(world):
        start = sum(range(1, rank + 1))
        expected = torch.arange(sum(in_splits) * 2, dtype=torch.float32).view(-1, 2) + 1000 * src
        assert torch.equal(
            out[src * (rank + 1) : (src + 1) * (rank + 1)], expected[start : start + rank + 1]
        )
    outs = [torch.empty(2) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((2,), float(rank * world + r)) for r in range(world)])
    assert [o[0].item() for o in outs] == [float(src * world + rank) for src in range(world)]


def check_send_recv_ring_and_exchange(rank, world, gloo):
    """Catches: p2p deadlocks when both peers send first with messages larger than the ring,
    and p2p messages crossing collective ones."""
    right, left = (rank + 1) % world, (rank - 1) % world
    big = torch.arange(3_000_000, dtype=torch.float32) + rank  # 12 MB > the 1 MiB p2p ring
    got = torch.empty_like(big)
    send = dist.isend(big, right)
    recv = dist.irecv(got, left)
    t = torch.ones(5)
    dist.all_reduce(t)  # a collective in between on the other lane
    send.wait()
    recv.wait()
    assert torch.equal(got, torch.arange(3_000_000, dtype=torch.float32) + left)
    assert torch.equal(t, torch.full((5,), float(world)))
    ops = [
        dist.P2POp(dist.isend, torch.full((3,), float(rank)), right),
        dist.P2POp(dist.irecv, got[:3], left),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(got[:3], torch.full((3,), float(left)))


def check_async_work_future_and_noncontiguous(rank, world, gloo):
    """Catches: futures never completed (DDP hooks hang), non-contiguous results not copied back,
    barrier returning before peers arrive."""
    x = torch.ones(1000, 8)
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(fut.wait(), torch.full((1000, 8), 2.0 * world))
    assert work.is_completed() and work.is_success()
    y = torch.ones(8, 1000).t()[::2]  # non-contiguous view
    dist.all_reduce(y)
    assert torch.equal(y, torch.full_like(y, float(world)))
    start = time.monotonic()
    if rank == 0:
        time.sleep(0.3)
    dist.barrier()
    assert time.monotonic() - start >= 0.25 or rank == 0


def check_large_sync_async_and_single_copy(rank, world, gloo):
    """Catches: large synchronous calls run in the caller's thread and asynchronous ones on the
    worker giving different results (or out of issue order), streaming-store all-gathers (output
    >= 16 MiB) writing wrong bytes, and single-copy messages (SHARDWISE_SINGLE_COPY_BYTES, read
    straight from the sender's memory) corrupting or reordering data."""

    def run(group):
        numel = (5 << 20) // 4 + 3  # 5 MiB + 12 bytes: several ring slabs, above inline size
        x = rank_input(rank, numel, torch.float32, "SUM")
        expected = x.clone()
        dist.all_reduce(expected, group=gloo)
        sync, pending = x.clone(), x.clone()
        work = dist.all_reduce(pending, group=group, async_op=True)
        dist.all_reduce(sync, group=group)  # queued behind the asynchronous one
        work.wait()
        assert torch.equal(sync, expected) and torch.equal(pending, expected)
        piece = rank_input(rank, (17 << 20) // 4 // world + 5, torch.float32, "SUM")
        gathered = torch.empty(piece.numel() * world)
        dist.all_gather_into_tensor(gathered, piece, group=group)
        want = torch.empty_like(gathered)
        dist.all_gather_into_tensor(want, piece, group=gloo)
        assert torch.equal(gathered, want)
        block = torch.empty(numel // world)
        whole = rank_input(rank, block.numel() * world, torch.float32, "SUM")
        dist.reduce_scatter_tensor(block, whole, group=group)
        whole_sum = whole.clone()
        dist.all_reduce(whole_sum, group=gloo)
        assert torch.equal(block, whole_sum.view(world, -1)[rank])
        b = x.clone() if rank == world - 1 else torch.zeros(numel)
        dist.broadcast(b, src=world - 1, group=group)
        assert torch.equal(b, rank_input(world - 1, numel, torch.float32, "SUM"))

    run(dist.group.WORLD)
    os.environ["SHARDWISE_SINGLE_COPY_BYTES"] = "4096"
    try:
        single_copy = dist.new_group(backend="shardwise")
    finally:
        del os.environ["SHARDWISE_SINGLE_COPY_BYTES"]
    run(single_copy)


def check_subgroups(rank, world, gloo):
    """Catches: subgroup rank translation and shared-memory names clashing between groups."""
    evens = dist.new_group([r for r in range(world) if r % 2 == 0], backend="shardwise")
    odds = dist.new_group([r for r in range(world) if r % 2 == 1], backend="shardwise")
    mine = evens if rank % 2 == 0 else odds
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    assert t.item() == sum(r for r in range(world) if r % 2 == rank % 2)


def check_ddp_matches_gloo(rank, world, gloo):
    """Catches: gradient averaging that differs from gloo's (DDP over shardwise must train the
    same model). At world 2 the sums are single additions, so results are bit-identical; beyond,
    the summation order may differ and the bound is a few float32 ulps of the gradient sum."""
    results = {}
    for name, group in (("shardwise", None), ("gloo", gloo)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
        )
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(5):
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        results[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
    if world == 2:
        assert torch.equal(results["shardwise"], results["gloo"])
    else:
        torch.testing.assert_close(results["shardwise"], results["gloo"], rtol=1e-6, atol=1e-7)


def _adversarial_leaves(count: int, numel: int) -> torch.Tensor:
    """[count, numel] float32 values +-(1 + f) * 2^e, e in [-30, 30]: every association of their
    sum shows in the bits."""
    g = torch.Generator().manual_seed(7)
    exponents = torch.randint(-30, 31, (count, numel), generator=g).float()
    signs = torch.randint(0, 2, (count, numel), generator=g).float() * 2 - 1
    return signs * (1 + torch.rand(count, numel, generator=g)) * torch.exp2(exponents)


def check_tree_reductions_do_not_depend_on_the_world(rank, world, gloo):
    """Catches a deterministic reduction whose bits depend on the world size, the backend or
    the algorithm (ring order, segmenting): 8 leaves, each rank summing its contiguous block
    pairwise, then the tree all-reduce / reduce-scatter over the shardwise backend and over
    gloo (the fallback) give the one-rank pairwise sum bit for bit, in float32 and (widened,
    rounded once) bfloat16; the plain all-reduce does not. World 3: refused, naming the fix."""
    from shardwise import _C

    leaves = _adversarial_leaves(8, 3001)
    if world & (world - 1):
        try:
            _C.tree_all_reduce_(dist.group.WORLD, leaves[0].clone())
        except ValueError as e:
            assert "power-of-two group size, got 3" in str(e), e
            return
        raise AssertionError("a world of 3 was not refused")
    block = leaves.view(world, 8 // world, -1)[rank]
    expected = _C.pairwise_sum_rows(leaves)
    plain = _C.pairwise_sum_rows(block)
    dist.all_reduce(plain)
    # two operands have one association; from 4 on the plain all-reduce (ring) differs. Across
    # hosts of two ranks the plain all-reduce is hierarchical: ((x0 + x1) + (x2 + x3)) at 2 x 2,
    # the tree itself, so there the inputs can show nothing.
    hosts: list = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    one_host = len(set(hosts)) == 1
    assert not torch.equal(plain, expected) or world <= 2 or not one_host, (
        "the inputs do not show association"
    )
    for group in (dist.group.WORLD, gloo):
        mine = _C.tree_all_reduce_(group, _C.pairwise_sum_rows(block))
        assert torch.equal(mine, expected), group
        share = expected.numel() // world
        flat = _C.pairwise_sum_rows(block)[: share * world]
        out = _C.tree_reduce_scatter(group, torch.empty(share), flat)
        assert torch.equal(out, expected[rank * share : (rank + 1) * share]), group
        half = leaves.bfloat16()
        got = _C.tree_all_reduce_(group, half[rank].clone())
        assert torch.equal(got, _C.pairwise_sum_rows(half[:world]).bfloat16()), group


def check_deterministic_engines_refuse_what_breaks_the_tree(rank, world, gloo):
    """Catches an engine that accepts deterministic=True and then cannot keep it: a group whose
    size the tree does not split (world 3), FSDP's no_sync (a running sum over micro-batches)
    and ZeRO's gradient_predivide_factor (nothing is divided in the mode), each refused with
    the fix before any gradient is reduced."""
    from shardwise.fsdp import FullyShardedDataParallel
    from shardwise.zero import ZeroEngine

    def refused(build, text):
        try:
            build()
        except ValueError as e:
            assert text in str(e), e
            return
        raise AssertionError(f"not refused: {text}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    if world & (world - 1):
        refused(lambda: FullyShardedDataParallel(model, deterministic=True), "power-of-two")
        return
    fsdp = FullyShardedDataParallel(model, deterministic=True)
    with fsdp.no_sync():
        refused(lambda: fsdp(torch.randn(4, 8)).sum().backward(), "leave no_sync out")
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_predivide_factor": 2.0,
              "zero_optimization": {"stage": 2}}  # fmt: skip
    other = torch.nn.Linear(8, 2)
    refused(lambda: ZeroEngine(other, config, deterministic=True), "gradient_predivide_factor")


def check_unsupported_dtype_names_it(rank, world, gloo):
    """Catches: unsupported input reaching the transport instead of a clear error."""
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.complex64).abs().to(torch.float8_e4m3fn))
    except (TypeError, RuntimeError) as e:
        assert "dtype" in str(e), str(e)
    else:
        raise AssertionError("no error")


def check_functional_ops_match_dist_opcheck_and_compile(rank, world, gloo):
    """Catches: functional collectives whose results, fake kernels or schemas disagree with the
    eager collectives, on the shardwise group and on a gloo group alike."""
    from shardwise.ops import collectives as fc

    x = torch.arange(world * 6, dtype=torch.float32).view(world * 2, 3) + rank
    for group in (None, gloo):
        expected = x.clone()
        dist.all_reduce(expected, group=group)
        assert torch.equal(fc.all_reduce(x, "sum", group), expected)
        gathered = torch.empty(world * world * 2, 3)
        dist.all_gather_into_tensor(gathered, x, group=group)
        assert torch.equal(fc.all_gather_into_tensor(x, group), gathered)
        scattered = torch.empty(2, 3)
        dist.reduce_scatter_tensor(scattered, x, group=group)
        assert torch.equal(fc.reduce_scatter_tensor(x, "sum", group), scattered)
    name = dist.distributed_c10d._get_default_group().group_name
    torch.library.opcheck(torch.ops.shardwise.all_reduce.default, (x, "max", name))
    torch.library.opcheck(torch.ops.shardwise.all_gather_into_tensor.default, (x, world, name))
    torch.library.opcheck(
        torch.ops.shardwise.reduce_scatter_tensor.default, (x, "sum", world, name)
    )

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(t):
        return fc.all_reduce(t * 2, "sum") + 1

    assert torch.equal(step(x), fc.all_reduce(x * 2, "sum") + 1)
    try:
        fc.all_reduce(x, "median")
    except ValueError as e:
        assert "'reduce_op'" in str(e) and "valid: sum" in str(e), str(e)
    else:
        raise AssertionError("no error")


def fault_mismatch(rank, world, gloo):
    """Catches: ranks calling collectives with different sizes hanging or returning garbage."""
    g = dist.new_group(backend="shardwise", timeout=datetime.timedelta(seconds=20))
    try:
        dist.all_reduce(torch.ones(100 if rank == 0 else 200), group=g)
    except RuntimeError as e:
        assert "mismatched collectives" in str(e) and "all_reduce #0" in str(e), str(e)
    else:
        raise AssertionError("no error")


def fault_timeout(rank, world, gloo):
    """Catches: a peer that never arrives making wait() hang instead of raising in time."""
    g = dist.new_group(backend="shardwise", timeout=datetime.timedelta(seconds=2))
    start = time.monotonic()
    if rank == 1:
        return  # never joins
    try:
        dist.all_reduce(torch.ones(10), group=g)
    except RuntimeError as e:
        assert "Timed out waiting for rank 1" in str(e), str(e)
    else:
        raise AssertionError("no error")
    assert time.monotonic() - start < 15


def fault_dead_peer(rank, world, gloo):
    """Catches: a rank killed mid-all-reduce leaving the others blocked; /dev/shm left dirty."""
    g = dist.new_group(backend="shardwise", timeout=datetime.timedelta(seconds=60))
    dist.barrier(group=g)
    if rank == 1:
        os._exit(0)  # dies without a word
    start = time.monotonic()
    try:
        for _ in range(50):
            dist.all_reduce(torch.ones(1_000_000), group=g)
    except RuntimeError as e:
        assert "exited" in str(e) and "rank 1" in str(e), str(e)
    else:
        raise AssertionError("no error")
    assert time.monotonic() - start < 15
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("shardwise-")], os.listdir(
        "/dev/shm"
    )


def cuda_ops_match_cpu(rank, world, gloo):
    """Catches: the NCCL path (dtype/op mapping, stream ordering) disagreeing with the CPU path."""
    torch.cuda.set_device(rank)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = rank_input(rank, 10_001, dtype, "SUM")
        expected = reference([rank_input(r, 10_001, dtype, "SUM") for r in range(world)], "SUM")
        y = x.cuda()
        dist.all_reduce(y)
        assert torch.equal(y.cpu(), expected), dtype
    x = torch.arange(6, dtype=torch.float32, device="cuda") + rank
    out = torch.empty(6 * world, device="cuda")
    dist.all_gather_into_tensor(out, x)
    assert torch.equal(out.cpu(), torch.cat([torch.arange(6.0) + r for r in range(world)]))
    rs = torch.empty(3, device="cuda")
    dist.reduce_scatter_tensor(rs, torch.ones(3 * world, device="cuda"))
    assert torch.equal(rs.cpu(), torch.full((3,), float(world)))
    b = torch.full((4,), float(rank), device="cuda")
    dist.broadcast(b, src=world - 1)
    assert torch.equal(b.cpu(), torch.full((4,), float(world - 1)))


SCENARIOS = {
    "ops": [f for n, f in sorted(globals().items()) if n.startswith("check_")]
    + conformance_checks.CHECKS,
    "faults": [fault_mismatch, fault_timeout, fault_dead_peer],
    "cuda": [cuda_ops_match_cpu],
    "fsdp": fsdp_checks.CHECKS,
    "zero": [*zero_checks.CHECKS, *zeropp_checks.CHECKS],
    "pipeline": pipeline_checks.CHECKS,
    "pipeline_fault": [pipeline_checks.fault_pipeline_stage_dies],
    "tensor_parallel": tp_checks.CHECKS,
    "debug": debug_checks.CHECKS,
}


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("shardwise", timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    results = {"__host__": socket.gethostname()}
    only = re.compile(os.environ.get("SHARDWISE_CHECKS", ""))  # a developer's selection
    for check in (c for c in SCENARIOS[scenario] if only.search(c.__name__)):
        try:
            check(rank, world, gloo)
            results[check.__name__] = "ok"
        except Exception:  # recorded, reported by the pytest side
            results[check.__name__] = traceback.format_exc()
        (out / f"rank{rank}.json").write_text(json.dumps(results))
    if scenario != "faults":
        # Rank 0 hosts the TCPStore: leaving before the others finish (e.g. while ranks 1 and 3
        # still build a subgroup that rank 0 is not in) would reset their store connections.
        dist.barrier(group=gloo)
        if scenario != "debug":  # its last check leaves the group mismatched
            dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
