"""The `shardwise` torch.distributed backend, multi-process, against gloo and exact references.

Each world size starts its processes once (launcher.run_world) and runs every check of
worker.py there; each check's docstring says which bug it catches.
"""

import functools

import pytest
from launcher import run_world
from worker import SCENARIOS


@functools.cache
def world_results(scenario: str, world_size: int, transport: str = "auto") -> list[dict]:
    return run_world(scenario, world_size, transport)


def assert_check(scenario: str, world_size: int, check: str, transport: str = "auto") -> None:
    results = world_results(scenario, world_size, transport)
    for rank, result in enumerate(results):
        status = result.get(check, f"never ran; log:\n{result.get('__log__')}")
        assert status == "ok", f"rank {rank}: {status}"


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("check", [f.__name__ for f in SCENARIOS["ops"]])
def test_ops(world_size, check):
    assert_check("ops", world_size, check)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("check", [f.__name__ for f in SCENARIOS["ops"]])
def test_ops_over_tcp(world_size, check):
    """The same checks with the TCP transport forced on one host (loopback)."""
    assert_check("ops", world_size, check, transport="tcp")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("check", [f.__name__ for f in SCENARIOS["faults"]])
def test_faults(check, transport):
    results = world_results("faults", 2, transport)
    status = results[0].get(check, f"never ran; log:\n{results[0].get('__log__')}")
    assert status == "ok", status
    if check != "fault_dead_peer":  # rank 1 exits on purpose there
        assert results[1].get(check) == "ok", results[1].get(check)
