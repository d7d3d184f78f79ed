"""shardwise ZeRO stages 0-3, multi-process: parity with single-process AdamW and torch's
ZeroRedundancyOptimizer, loss scaling, memory against the formulas, resharding checkpoints and
config errors, and DeepSpeed's ZeRO++ keys. Each world size starts its processes once
(launcher.run_world) and runs every check of zero_checks.py and zeropp_checks.py; each check's
docstring says which bug it catches."""

import functools

import pytest
from launcher import run_world
from zero_checks import CHECKS
from zeropp_checks import CHECKS as ZEROPP_CHECKS


@functools.cache
def world_results(world_size: int) -> list[dict]:
    return run_world("zero", world_size, timeout=600)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("check", [f.__name__ for f in [*CHECKS, *ZEROPP_CHECKS]])
def test_zero(world_size, check):
    for rank, result in enumerate(world_results(world_size)):
        status = result.get(check, f"never ran; log:\n{result.get('__log__')}")
        assert status == "ok", f"rank {rank}: {status}"
