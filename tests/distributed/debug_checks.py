"""Debugging and profiling over the shardwise backend (issue 17), run with
TORCH_DISTRIBUTED_DEBUG=DETAIL (torch wraps the backend in its ProcessGroupWrapper, which checks
every collective's fingerprint across ranks) and SHARDWISE_DEBUG=INFO, SUBSYS=COLL."""

import torch
import torch.distributed as dist
from shardwise import _C


def detail_mode_runs_collectives_on_the_world_and_a_subgroup(rank, world, gloo):
    """DETAIL mode wraps the backend; every collective on a sub-group used to fail with
    "Backend shardwise does not yet support sequence numbers"."""
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((5,), world * (world + 1) / 2))
    pair = dist.new_group([0, 1])
    if rank < 2:
        y = torch.full((3,), float(rank))
        dist.all_reduce(y, group=pair)
        assert torch.equal(y, torch.ones(3)), y
        out = [torch.empty(2) for _ in range(2)]
        dist.all_gather(out, torch.full((2,), float(rank)), group=pair)
        assert [o[0].item() for o in out] == [0.0, 1.0]
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=world - 1)
    assert torch.equal(b, torch.full((4,), float(world - 1)))


def collectives_appear_in_the_profiler_under_their_names(rank, world, gloo):
    """torch.profiler shows each collective as shardwise:<op> (as gloo's show as gloo:<op>),
    its event lasting until the operation completes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(torch.ones(64))
        out = torch.empty(64 * world)
        dist.all_gather_into_tensor(out, torch.ones(64))
        dist.barrier()
    names = {e.name for e in prof.events()}
    for name in ("shardwise:all_reduce", "shardwise:_allgather_base", "shardwise:barrier"):
        assert name in names, sorted(n for n in names if ":" in n)


def communication_stats_count_calls_and_payload(rank, world, gloo):
    """_C.communication_stats (what training.profile_communication logs): one all_reduce of 1000
    float32 adds one call and 4000 bytes; an all_gather into 64 × world floats its output."""
    before = _C.communication_stats()
    dist.all_reduce(torch.ones(1000))
    out = torch.empty(64 * world)
    dist.all_gather_into_tensor(out, torch.ones(64))
    after = _C.communication_stats()

    def delta(kind, key):
        return after[kind][key] - before.get(kind, {}).get(key, 0)

    assert (delta("all_reduce", "calls"), delta("all_reduce", "bytes")) == (1, 4000)
    assert (delta("all_gather", "calls"), delta("all_gather", "bytes")) == (1, 256 * world)
    assert delta("all_reduce", "seconds") > 0


def detail_mode_names_a_mismatched_collective(rank, world, gloo):
    """Rank 0 all-reduces while the others broadcast: DETAIL mode's fingerprint check raises on
    every rank, naming both operations, instead of a hang or a silent wrong result."""
    t = torch.ones(8)
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.broadcast(t, src=0)
    except RuntimeError as error:
        text = str(error)
        assert "mismatch" in text.lower() and "ALLREDUCE" in text and "BROADCAST" in text, text
    else:
        raise AssertionError("a mismatched collective ran")


CHECKS = [
    detail_mode_runs_collectives_on_the_world_and_a_subgroup,
    collectives_appear_in_the_profiler_under_their_names,
    communication_stats_count_calls_and_payload,
    detail_mode_names_a_mismatched_collective,  # last: the group is of no use after it
]
