"""What PyTorch's own distributed suite asks of a CPU backend beyond the common collectives
(issue 18), checked inside the "ops" worlds of worker.py against gloo: all_gather_coalesced,
the sparse all_reduce, monitored_barrier naming the ranks that did not arrive, the receive from
any source, and the words "Timed out" in a timeout."""

import datetime
import time

import torch
import torch.distributed as dist

SHORT = datetime.timedelta(seconds=0.5)


def _expect(fn, pattern):
    try:
        fn()
    except (RuntimeError, ValueError) as error:
        assert pattern in str(error), f"{pattern!r} not in {error}"
    else:
        raise AssertionError(f"no error; expected one with {pattern!r}")


def check_all_gather_coalesced_matches_gloo(rank, world, gloo):
    """Catches: outputs of one rank placed in another's list, shapes cut at the wrong byte
    offsets (0-dim, empty and 2-D inputs of one dtype, as torch's API allows), 2-byte dtypes,
    inputs read after the call returned."""
    g = torch.Generator().manual_seed(rank)
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        inputs = [
            (torch.arange(7) + rank).to(dtype),
            torch.tensor(rank * 3).to(dtype),  # 0-dim
            torch.empty(0, 4, dtype=dtype),
            (torch.randn(3, 2, generator=g) * 10).to(dtype),
        ]
        results = {}
        for name, group in (("shardwise", None), ("gloo", gloo)):
            outputs = [[torch.empty_like(t) for t in inputs] for _ in range(world)]
            work = dist.all_gather_coalesced(outputs, inputs, group=group, async_op=True)
            if name == "shardwise":
                inputs[0].add_(100)  # the call has copied what it sends
            work.wait()
            if name == "shardwise":
                inputs[0].sub_(100)
            results[name] = outputs
        for r in range(world):
            for ours, theirs in zip(results["shardwise"][r], results["gloo"][r], strict=True):
                assert torch.equal(ours, theirs), (dtype, r, ours, theirs)


def _sparse(rank, seed, shape=(10, 3)):
    g = torch.Generator().manual_seed(seed + rank)
    nnz = 1 + (rank * 3 + seed) % 5  # a different count on every rank
    rows = torch.randint(0, shape[0], (nnz,), generator=g)
    values = torch.randn(nnz, *shape[1:], generator=g)
    return torch.sparse_coo_tensor(rows.unsqueeze(0), values, shape)


def check_sparse_all_reduce_matches_gloo(rank, world, gloo):
    """Catches: ranks with different nnz (padding read as entries), duplicate indices not
    summed, values of one rank lost, a dense reduction op accepted for sparse tensors."""
    for seed in (0, 7):
        ours, theirs = _sparse(rank, seed), _sparse(rank, seed)
        dist.all_reduce(ours)
        dist.all_reduce(theirs, group=gloo)
        dense = sum(_sparse(r, seed).to_dense() for r in range(world))
        assert torch.allclose(ours.to_dense(), dense, atol=1e-6), seed
        assert torch.allclose(ours.to_dense(), theirs.to_dense(), atol=1e-6), seed
        assert ours.is_coalesced()
    empty = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0), (5,))
    dist.all_reduce(empty)
    assert empty._nnz() == 0
    _expect(lambda: dist.all_reduce(_sparse(rank, 1), op=dist.ReduceOp.MAX), "ReduceOp.SUM only")


def check_monitored_barrier_names_missing_ranks(rank, world, gloo):
    """Catches: monitored_barrier missing (torch's default raises), a rank that did not arrive
    reported as a timeout of rank 0, wait_all_ranks naming only the first, the other ranks
    left waiting forever, and a group unusable after a failed barrier."""
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    late = world - 1
    group = dist.new_group()
    if rank == 0:
        _expect(lambda: dist.monitored_barrier(group, SHORT), f"Rank {late} failed to pass")
    elif rank != late:
        _expect(lambda: dist.monitored_barrier(group, SHORT), "successfully reached")
    everyone = dist.new_group()
    if rank == 0:
        names = ", ".join(str(r) for r in range(1, world))
        fails = f"Ranks {names} failed to pass monitoredBarrier"
        _expect(lambda: dist.monitored_barrier(everyone, SHORT, wait_all_ranks=True), fails)
        _expect(lambda: dist.monitored_barrier(dist.new_group(), datetime.timedelta(0)),
                "Rank 0 timed out in monitoredBarrier")  # fmt: skip
    else:
        dist.new_group()
    t = torch.ones(3)
    dist.all_reduce(t)  # the transport is untouched by the failed barriers
    assert torch.equal(t, torch.full((3,), float(world)))


def check_recv_from_any_source_names_the_sender(rank, world, gloo):
    """Catches: recv(src=None) unsupported, the source rank not reported (or reported as
    another), messages of one sender taken out of order, a receive from any source stealing
    the sequence number of a later named receive, and sends that arrive late never found."""
    for name, group in (("shardwise", None), ("gloo", gloo)):
        if rank == 0:
            got = {}
            for _ in range(2 * (world - 1)):
                t = torch.empty(4)
                source = dist.recv(t, group=group)  # any source
                got.setdefault(source, []).append(t[0].item())
            # each sender's two messages in the order sent
            assert got == {r: [r * 10.0, r * 10.0 + 1] for r in range(1, world)}, (name, got)
        elif rank == 1:
            time.sleep(0.2)  # the other senders' messages arrive first
        if rank > 0:
            for k in range(2):
                dist.send(torch.full((4,), rank * 10.0 + k), 0, group=group)
        dist.barrier(group=group)
        if rank == 0:  # a named receive, then one from any source: the next of the same sender
            named, anyone = torch.empty(2), torch.empty(2)
            dist.recv(named, src=world - 1, group=group)
            source = dist.recv(anyone, group=group)
            assert named.tolist() == [1.0, 1.0] and anyone.tolist() == [2.0, 2.0], (name, named)
            assert source == world - 1, (name, source)
        elif rank == world - 1:
            dist.send(torch.full((2,), 1.0), 0, group=group)
            dist.send(torch.full((2,), 2.0), 0, group=group)
        dist.barrier(group=group)
    if rank == 0:  # a wait with nothing sent ends with the words of a timeout
        lonely = dist.new_group(timeout=datetime.timedelta(seconds=0.5))
        work = lonely.recv_anysource([torch.empty(1)], 0)
        _expect(work.wait, "Timed out waiting for a message from any of ranks")
    else:
        dist.new_group(timeout=datetime.timedelta(seconds=0.5))
    dist.barrier()


CHECKS = [f for n, f in sorted(globals().items()) if n.startswith("check_")]
