"""shardwise tensor parallelism, multi-process: the vocabulary-parallel loss, the GPT at tp = world
(with and without sequence parallelism, shardwise backend and gloo) against one process, 2 x 2
meshes against single-process AdamW, mesh groups and refusals. Each world size starts its
processes once (launcher.run_world); each check's docstring says which bug it catches."""

import functools

import pytest
from launcher import run_world
from tp_checks import CHECKS


@functools.cache
def world_results(world_size: int) -> list[dict]:
    return run_world("tensor_parallel", world_size, timeout=600)


# a 2 x 2 mesh needs 4 ranks: its checks run at world 4 only
CASES = [
    (world, f.__name__)
    for world in (2, 4)
    for f in CHECKS
    if world == 4 or "_mesh_matches" not in f.__name__
]


@pytest.mark.parametrize("world_size,check", CASES)
def test_tensor_parallel(world_size, check):
    for rank, result in enumerate(world_results(world_size)):
        status = result.get(check, f"never ran; log:\n{result.get('__log__')}")
        assert status == "ok", f"rank {rank}: {status}"
