"""The `shardwise` torch.distributed backend, multi-process, against gloo and exact references.

Each world size starts its processes once (launcher.run_world) and runs every check of
worker.py there; each check's docstring says which bug it catches.
"""

import functools

import pytest
import torch
from hosts import can_make_namespaces, in_host, two_hosts
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


@functools.cache
def two_host_results() -> list[dict]:
    with two_hosts() as hosts:

        def wrap(rank, argv, env):  # ranks 0, 1 on host 0; ranks 2, 3 on host 1
            host = hosts[rank // 2]
            env = dict(
                env, GLOO_SOCKET_IFNAME=host.interface, SHARDWISE_SOCKET_IFNAME=host.interface
            )
            return in_host(host, rank // 2, argv), env

        return run_world("ops", 4, master_addr=hosts[0][1], wrap=wrap)


@pytest.mark.parametrize("check", [f.__name__ for f in SCENARIOS["ops"]])
def test_two_hosts_over_tcp(check):
    """2 hosts x 2 ranks on a bridge: catches TCP bootstrap/binding bugs that
    loopback hides (binding to the interface that reaches the master, cross-host addresses)."""
    reason = can_make_namespaces()
    if reason:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    results = two_host_results()
    assert [r.get("__host__") for r in results] == ["host0", "host0", "host1", "host1"]
    for rank, result in enumerate(results):
        status = result.get(check, f"never ran; log:\n{result.get('__log__')}")
        assert status == "ok", f"rank {rank}: {status}"


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (one per rank)")
def test_cuda_tensors_go_through_nccl():
    """CUDA tensors on the shardwise backend: all_reduce (3 dtypes), all_gather_into_tensor,
    reduce_scatter_tensor and broadcast through its own NCCL communicator."""
    for rank, result in enumerate(world_results("cuda", 2)):
        status = result.get("cuda_ops_match_cpu", f"never ran; log:\n{result.get('__log__')}")
        assert status == "ok", f"rank {rank}: {status}"


def _debug_env(rank, argv, env):
    env = dict(env, TORCH_DISTRIBUTED_DEBUG="DETAIL", SHARDWISE_DEBUG="INFO")
    return argv, dict(env, SHARDWISE_DEBUG_SUBSYS="COLL")


@functools.cache
def debug_results(world_size: int) -> list[dict]:
    return run_world("debug", world_size, wrap=_debug_env)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("check", [f.__name__ for f in SCENARIOS["debug"]])
def test_debugging_and_profiling(world_size, check):
    """debug_checks.py under TORCH_DISTRIBUTED_DEBUG=DETAIL and SHARDWISE_DEBUG=INFO."""
    for rank, result in enumerate(debug_results(world_size)):
        status = result.get(check, f"never ran; log:\n{result.get('__log__')}")
        assert status == "ok", f"rank {rank}: {status}"


def test_shardwise_debug_logs_collectives_like_nccl_debug():
    """SHARDWISE_DEBUG=INFO with SUBSYS=COLL: one line per completed operation with the rank,
    the kind, its sequence number and the bytes (the set-up line comes first, out of the tail)."""
    log = debug_results(2)[1]["__log__"]
    assert "shardwise INFO rank 1: all_reduce #" in log and " 4000 bytes " in log, log[-2000:]
