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


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("check", [f.__name__ for f in CHECKS])
def test_tensor_parallel(world_size, check):
    if "_mesh_matches" in check and world_size != 4:
        pytest.skip("a 2 x 2 mesh needs 4 ranks")
    for rank, result in enumerate(world_results(world_size)):
        status = result.get(check, f"never ran; log:\n{result.get('__log__')}")
        assert status == "ok", f"rank {rank}: {status}"
