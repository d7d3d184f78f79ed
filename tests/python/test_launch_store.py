"""shardwise.distributed.launch_store: the keys of each torchrun launch apart from the failed
launch's, on the store torchrun's agent keeps across restarts."""

import datetime

import pytest
import torch.distributed as dist
from shardwise import distributed

TIMEOUT = datetime.timedelta(seconds=10)


@pytest.fixture
def agent_store(monkeypatch):
    """A TCPStore standing for torchrun's agent's, with the variables it gives its workers."""
    server = dist.TCPStore("127.0.0.1", 0, 1, True, TIMEOUT)
    for var, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(server.port)),
                       ("WORLD_SIZE", "2"), ("TORCHELASTIC_USE_AGENT_STORE", "True")):  # fmt: skip
        monkeypatch.setenv(var, value)
    return server


def _launch(monkeypatch, ranks, restart_count: int, nodes: int):
    """Each rank's launch_store in one launch."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart_count))
    monkeypatch.setenv("GROUP_WORLD_SIZE", str(nodes))
    stores = []
    for rank in ranks:
        monkeypatch.setenv("RANK", str(rank))
        stores.append(distributed.launch_store(TIMEOUT))
    return stores


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_restarted_launch_does_not_read_the_failed_launchs_keys(monkeypatch, agent_store, nodes):
    """A key rank 0 wrote in the failed launch is absent for the restarted one (on two nodes
    rank 0's agent still says restart 0: the ranks' own launch counts tell them apart), and
    what rank 0 writes in a launch, rank 1 of that launch reads."""
    first = _launch(monkeypatch, (0, 1), 0, nodes)
    first[0].set("rank_0_address", "dead")
    assert first[1].get("rank_0_address") == b"dead"
    again = _launch(monkeypatch, (0, 1), 0 if nodes == 2 else 1, nodes)
    assert not again[1].check(["rank_0_address"])
    again[0].set("rank_0_address", "alive")
    assert again[1].get("rank_0_address") == b"alive"
    assert first[1].get("rank_0_address") == b"dead"


def test_no_store_outside_torchrun(monkeypatch):
    """Without torchrun's agent store, init_process_group is torch's env:// one."""
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert distributed.launch_store() is None
