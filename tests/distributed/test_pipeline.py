"""shardwise pipeline parallelism, multi-process: every schedule against the unpipelined model
(loss and gradients), variable shapes, argument errors, and a stage that dies mid-step. Each world
size starts its processes once (launcher.run_world); each check's docstring says which bug it
catches."""

import functools

import pytest
from launcher import run_world
from pipeline_checks import CHECKS


@functools.cache
def world_results(scenario: str, world_size: int) -> list[dict]:
    return run_world(scenario, world_size, timeout=600)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("check", [f.__name__ for f in CHECKS])
def test_pipeline(world_size, check):
    if "_x_pp_" in check and world_size != 4:
        pytest.skip("a 2 × 2 mesh needs 4 ranks")
    for rank, result in enumerate(world_results("pipeline", world_size)):
        status = result.get(check, f"never ran; log:\n{result.get('__log__')}")
        assert status == "ok", f"rank {rank}: {status}"


def test_a_dying_stage_makes_the_others_raise():
    results = world_results("pipeline_fault", 2)
    status = results[0].get("fault_pipeline_stage_dies", f"log:\n{results[0].get('__log__')}")
    assert status == "ok", status
