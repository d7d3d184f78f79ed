"""The guides' own command lines, run as written: the FSDP guide's
``torchrun --nproc_per_node=auto ... --config <fsdp config> --use-fsdp`` and the mesh guide's
``model.mesh_shape`` overrides on top of the FSDP example config (an fsdp axis of size 1 shards
nothing, as torch's FSDP at world 1, rather than being refused)."""

from __future__ import annotations

import os

import pytest
from train_runs import losses, run

STEPS = ("training.max_steps=4", "training.micro_batch_size=2", "training.eval_every=0")


@pytest.mark.skipif((os.cpu_count() or 1) > 4, reason="auto starts one process per CPU core")
def test_torchrun_auto_with_use_fsdp_trains_with_fsdp_on_every_core():
    """torchrun's --nproc_per_node=auto starts one process per core on a machine without GPUs;
    --use-fsdp on a config without the key shards the model over all of them (the step
    reduce-scatters; --profile-communication is a flag too). Catches the flag unknown (exit 2)
    or parsed and not applied (the run would all-reduce as DDP)."""
    _, recs, _ = run("guide_auto", "auto", "ddp.yaml", *STEPS, "distributed.strategy=null",
                     "--use-fsdp", "--profile-communication")  # fmt: skip
    assert len(recs[0]["model_state_bytes_per_rank"]) == os.cpu_count()
    ops = recs[-1]["communication"]
    assert ops.get("reduce_scatter", {}).get("calls", 0) > 0, ops


def test_the_mesh_guides_tensor_parallel_mesh_runs_over_the_fsdp_config():
    """model.mesh_shape=[[1,2],["fsdp","tp"]] over fsdp.yaml as written: FSDP over one rank
    (nothing sharded) beside 2-way tensor parallelism trains as DDP over one rank beside it
    (--no-use-fsdp, a 'dp' axis): the same losses within 1e-5 in fp32. The single-device mesh
    [[1,1]] runs one process the same way. Catches the size-1 fsdp axis refused, or sharding
    that changes the numbers."""
    tp = 'model.mesh_shape=[[1,2],["{}","tp"]]'
    _, fsdp, _ = run("guide_fsdp1_tp2", 2, "fsdp.yaml", *STEPS, tp.format("fsdp"))
    _, ddp, _ = run("guide_dp1_tp2", 2, "fsdp.yaml", *STEPS, tp.format("dp"), "--no-use-fsdp")
    for ours, theirs in ((fsdp, ddp),) + _single_device():
        a, b = losses(ours), losses(theirs)
        assert a.keys() == b.keys() and len(a) == 4, (a, b)
        assert all(abs(a[s] - b[s]) <= 1e-5 * abs(b[s]) for s in a), (a, b)


def _single_device():
    one = 'model.mesh_shape=[[1,1],["{}","tp"]]'
    _, fsdp, _ = run("guide_fsdp1", 1, "fsdp.yaml", *STEPS, one.format("fsdp"))
    _, plain, _ = run("guide_dp1", 1, "fsdp.yaml", *STEPS, one.format("dp"), "--no-use-fsdp")
    return ((fsdp, plain),)
