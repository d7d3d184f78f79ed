"""Pipeline checks run inside a world of worker processes (see worker.py): every schedule, for
several microbatch counts (m < p included), against the unpipelined model in one process: the
loss and every gradient of this rank's stages."""

import os
import time

import shardwise.pipeline as pp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DIM = 16


def make_blocks(count, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(count))


def _rel(ours, ref):
    return ((ours.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _parity(rank, world, kind, m, v=1):
    stages = world * v
    blocks = make_blocks(stages)
    reference = make_blocks(stages)
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(2 * m, DIM, generator=g)
    y = torch.randn(2 * m, DIM, generator=g)
    ref_loss = F.mse_loss(nn.Sequential(*reference)(x), y)
    ref_loss.backward()
    schedule = pp.make_schedule(kind, world, m, v)
    mine = {s: blocks[s] for s in range(stages) if s % world == rank}
    pipe = pp.Pipeline(mine, schedule, F.mse_loss)
    loss = pipe.step(x, y)
    what = f"{kind} p={world} m={m} v={v}"
    if (stages - 1) % world == rank:
        assert abs(loss - ref_loss.item()) <= 1e-6 * abs(ref_loss.item()), (
            f"{what}: loss {loss} vs {ref_loss.item()}"
        )
    for s in mine:
        for (name, p), q in zip(
            blocks[s].named_parameters(), reference[s].parameters(), strict=True
        ):
            err = _rel(p.grad, q.grad)
            assert err <= 1e-6, f"{what}: stage {s} {name} gradient relative error {err:.2e}"
    return pipe.last


def _microbatch_counts(p):
    return sorted({1, p - 1, p, 2 * p + 1} - {0})


def pipeline_gpipe_matches_unpipelined(rank, world, gloo):
    """GPipe: activations and gradients routed to the right stage and microbatch, loss scaled
    once by 1/m, gradients accumulated over microbatches."""
    for m in _microbatch_counts(world):
        _parity(rank, world, "gpipe", m)


def pipeline_1f1b_matches_unpipelined(rank, world, gloo):
    """1F1B: the interleaving of forwards and backwards (a stash popped out of order, or a
    gradient sent to the wrong microbatch, shows as a gradient error); m < p degenerates."""
    for m in _microbatch_counts(world):
        last = _parity(rank, world, "1f1b", m)
        assert last["peak_stashed"] == min(m, world - rank), last["peak_stashed"]


def pipeline_interleaved_matches_unpipelined(rank, world, gloo):
    """Interleaved 1F1B with 2 stages per rank: channel order between ranks that exchange both
    activations and gradients, and local stage-to-stage hand-offs."""
    for m in _microbatch_counts(world):
        _parity(rank, world, "interleaved_1f1b", m, v=2)


def pipeline_variable_shapes_across_steps(rank, world, gloo):
    """The header before every message: a second step with another batch size and sequence
    shape must still line up (a cached shape would mis-receive)."""
    blocks = make_blocks(world)
    mine = {rank: blocks[rank]}
    pipe = pp.Pipeline(mine, pp.make_schedule("1f1b", world, 2), F.mse_loss)
    for rows in (4, 6):
        x = torch.randn(rows, 3, DIM)
        y = torch.randn(rows, 3, DIM)
        pipe.step(x, y)
        for p in blocks[rank].parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all()
            p.grad = None


def pipeline_bad_arguments_are_named(rank, world, gloo):
    """Stages that do not match the schedule, and batches that cannot be cut into m pieces."""
    blocks = make_blocks(world)
    schedule = pp.make_schedule("1f1b", world, 3)
    try:
        pp.Pipeline({(rank + 1) % world: blocks[0]}, schedule, F.mse_loss)
    except ValueError as e:
        assert f"rank {rank} must hold stages" in str(e), str(e)
    else:
        raise AssertionError("wrong stages accepted")
    try:
        pp.make_schedule("zigzag", world, 3)
    except ValueError as e:
        assert "valid: gpipe, 1f1b, interleaved_1f1b" in str(e), str(e)
    else:
        raise AssertionError("unknown schedule accepted")


CHECKS = [
    pipeline_gpipe_matches_unpipelined,
    pipeline_1f1b_matches_unpipelined,
    pipeline_interleaved_matches_unpipelined,
    pipeline_variable_shapes_across_steps,
    pipeline_bad_arguments_are_named,
]


def fault_pipeline_stage_dies(rank, world, gloo):
    """A stage process that dies mid-step: the others must raise (naming the dead rank), not
    hang in a receive."""
    blocks = make_blocks(world)

    def dying(x):
        os._exit(0)

    stage = dying if rank == world - 1 else blocks[rank]
    pipe = pp.Pipeline({rank: stage}, pp.make_schedule("1f1b", world, 4), F.mse_loss)
    dist.barrier()
    start = time.monotonic()
    try:
        pipe.step(torch.randn(8, DIM), torch.randn(8, DIM))
    except RuntimeError as e:
        assert f"rank {world - 1}" in str(e), str(e)
    else:
        raise AssertionError("no error")
    assert time.monotonic() - start < 15, time.monotonic() - start
