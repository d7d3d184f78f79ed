"""The planner's count of a step's collectives (``step_collectives.py``, which
``collective_latency.py`` prices) against the shardwise backend's own counters in a real run of
the same config (``training.profile_communication``: rank 0's calls per kind in a step)."""

import pytest
import train_runs
from shardwise.train import config_plan, prediction
from shardwise.train.config import load_config
from shardwise.train.device import device_memory_bytes

RUNS = {
    # name: (config, overrides); 2 ranks each, every engine whose counts differ
    "ddp": ("ddp.yaml", []),  # 2 accumulated micro-batches, reduced once
    "zero2": ("zero2.yaml", ["training.gradient_accumulation_steps=2"]),
    "zero3": (
        "zero2.yaml",
        ["distributed.zero.zero_optimization.stage=3", "training.gradient_accumulation_steps=2"],
    ),
    "fsdp": ("fsdp.yaml", ["model.preset=tiny", "training.gradient_accumulation_steps=2"]),
    "shard_grad_op": (
        "fsdp.yaml",
        [
            "model.preset=tiny",
            "training.gradient_accumulation_steps=2",
            "distributed.fsdp_sharding_strategy=shard_grad_op",
        ],
    ),
    "pipeline": ("pipeline_1f1b.yaml", ["training.gradient_accumulation_steps=2"]),
}


def _predicted(config: str, overrides: list[str]) -> dict:
    cfg = load_config(str(train_runs.CONFIGS / config), overrides, env={"WORLD_SIZE": "2"})
    plan = config_plan.plan_for_config(cfg, device_memory_bytes(2, "cpu"))
    result = prediction.for_config(cfg, plan, "cpu")
    return result.times[result.strategy].collectives


@pytest.mark.parametrize("name", list(RUNS))
def test_a_step_runs_the_collectives_the_planner_counts(name, tmp_path):
    """Two ranks, 3 steps; the last step's calls per kind on rank 0 equal the planner's count
    for the config's row. Catches a count that misses what an engine does per micro-batch
    (ZeRO's reduce-scatter in every accumulated micro-batch, FSDP's backward re-gather of all
    units but the root), per schedule run (a pipeline's tied-embedding message and gradient
    average, each once per accumulated batch, two messages per tensor: header and data), or
    the trainer's own collectives (the loss's mean, the norm over the shards), any of which
    moves the latency the planner charges a step."""
    config, overrides = RUNS[name]
    recs, log = train_runs.train(
        2, config, tmp_path / name, "training.max_steps=3", "training.warmup_steps=1",
        "training.eval_every=0", "training.checkpoint.every_steps=1000",
        "training.profile_communication=true", *overrides,
    )  # fmt: skip
    measured = [r["communication"] for r in recs if "communication" in r]
    assert measured, log[-3000:]
    calls = {kind: d["calls"] for kind, d in measured[-1].items()}
    assert calls == _predicted(config, overrides)
