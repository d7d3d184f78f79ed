"""The backend's SHARDWISE_* choices are checked when a group is made: a value it does not know is
refused there, naming the variable and the values it takes, instead of being ignored."""

import pytest
import shardwise  # noqa: F401  (registers the backend)
import torch.distributed as dist


@pytest.mark.parametrize(
    ("variable", "value", "choices"),
    [
        ("SHARDWISE_RING_STORES", "cached", "use auto"),
        ("SHARDWISE_CUDA_COMM", "gloo", "use auto"),
        ("SHARDWISE_HIERARCHICAL", "yes", "SHARDWISE_HIERARCHICAL"),
        ("SHARDWISE_HOST_ID", "", "unset it"),
    ],
)
def test_an_unknown_choice_is_refused_naming_it(monkeypatch, variable, value, choices):
    monkeypatch.setenv(variable, value)
    with pytest.raises(Exception) as error:
        dist.init_process_group("shardwise", store=dist.HashStore(), rank=0, world_size=1)
    if dist.is_initialized():
        dist.destroy_process_group()
    assert f"{variable}" in str(error.value) and choices in str(error.value), str(error.value)


def test_each_ring_store_kind_runs_a_group(monkeypatch):
    """Each accepted value makes a working group (a group of one: the choice is parsed, the
    collectives run locally)."""
    import torch

    for value in ("auto", "ordinary", "streaming"):
        monkeypatch.setenv("SHARDWISE_RING_STORES", value)
        dist.init_process_group("shardwise", store=dist.HashStore(), rank=0, world_size=1)
        try:
            t = torch.ones(4)
            dist.all_reduce(t)
            assert torch.equal(t, torch.ones(4))
        finally:
            dist.destroy_process_group()
