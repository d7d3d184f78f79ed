"""training.optimizer=lamb under every strategy: the same run at world 1 and sharded or
replicated at worlds 2 and 4 (one global batch), so a trust ratio taken over one rank's piece
of a parameter instead of all of them shows as a different loss."""

from __future__ import annotations

import pytest
from train_runs import losses, run

STEPS = ("training.max_steps=6", "training.eval_every=0", "training.optimizer=lamb",
         "training.learning_rate=2e-2", "training.gradient_accumulation_steps=1",
         "training.lr_scaling=none")  # fmt: skip
CASES = {  # name: (world, config, overrides, relative tolerance)
    "ddp": (2, "ddp.yaml", ("training.micro_batch_size=2",), 1e-5),
    "fsdp": (2, "fsdp.yaml", ("training.micro_batch_size=2",), 1e-5),
    "zero2": (2, "zero2.yaml", ("training.micro_batch_size=2",), 1e-5),
    "zero3": (2, "zero2.yaml", ("training.micro_batch_size=2",
                                "distributed.zero.zero_optimization.stage=3"), 1e-5),
    "pipeline": (2, "pipeline_1f1b.yaml", ("training.micro_batch_size=1",
                                           "distributed.pipeline.num_microbatches=4"), 1e-5),
    "fsdp_x_tp": (4, "fsdp_x_tp.yaml", ("training.micro_batch_size=2",
                                        "training.mixed_precision=no"), 1e-5),
}  # fmt: skip


def _reference():
    return run("lamb_world1", 1, "ddp.yaml", *STEPS, "training.micro_batch_size=4")[1]


@pytest.mark.parametrize("name", CASES)
def test_lamb_trains_alike_at_every_world_size(name):
    """LAMB at world 2 (DDP, FSDP, ZeRO-2, ZeRO-3, a 2-stage pipeline) and 4 (fsdp x tp) gives
    the one-process run's losses: FSDP's and ZeRO's ratios add up each parameter's shards over
    the data group, tensor parallelism's over the tp group as well; a ratio of one rank's piece
    changes the update at once. And LAMB is not AdamW: the same run under AdamW differs."""
    world, config, overrides, rel = CASES[name]
    ref = _reference()
    _, recs, _ = run(f"lamb_{name}", world, config, *STEPS, *overrides)
    assert losses(recs) == pytest.approx(losses(ref), rel=rel)
    adamw = run("lamb_world1_adamw", 1, "ddp.yaml", *STEPS, "training.micro_batch_size=4",
                "training.optimizer=adamw")[1]  # fmt: skip
    assert abs(losses(adamw)[6] - losses(ref)[6]) > 1e-3 * losses(ref)[6]
