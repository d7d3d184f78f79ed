"""Named model families (``models/families.py``): ``model=gemma3_1b`` and the others build the
released models' shapes (parameter counts equal the published ones, on the meta device, nothing
downloaded), ``model.hf_overrides`` shrinks them consistently, the planner answers for them, and
tensor parallelism or the pipeline either covers a family or is refused naming the fix."""

from __future__ import annotations

import pytest
from shardwise.models.causal_lm import hf_config
from shardwise.models.families import FAMILIES
from shardwise.train import config_plan
from shardwise.train.config import load_config

pytest.importorskip("transformers")


def load(*overrides, world=1):
    return load_config(
        None, [*overrides, f"distributed.world_size={world}"], env={}, cuda_devices=0
    )


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_has_the_released_models_parameter_count(name):
    """Catches a published field mistyped (a count off by a layer, a head, the vocabulary or
    an untied head)."""
    cfg = load(f"model={name}", "data.seq_len=16")
    assert cfg.model.hf_config == name
    assert cfg.gpt_config().num_parameters() == FAMILIES[name][2]


def test_overrides_shrink_a_family_consistently():
    """hf_overrides are given to the config's constructor, so what it derives follows: Gemma 3's
    layer types (every sixth layer full attention) for 6 layers, Llama's head size from its
    width. Catches fields set after construction that leave derived ones stale."""
    gemma = hf_config("gemma3_1b", {"num_hidden_layers": 6, "hidden_size": 64})
    assert len(gemma.layer_types) == 6 and gemma.layer_types[5] == "full_attention"
    assert gemma.layer_types[:5] == ["sliding_attention"] * 5
    assert gemma.sliding_window == 512 and gemma.head_dim == 256  # the published rest
    llama = hf_config("llama", {"hidden_size": 64, "num_attention_heads": 4})
    assert llama.head_dim == 16


def test_a_misspelled_family_is_named_with_the_choices():
    with pytest.raises(ValueError, match="did you mean gemma3_1b") as info:
        load("model=gema3_1b")
    assert "llama3_8b" in str(info.value) and "qwen2_0_5b" in str(info.value)


def test_the_planner_answers_for_a_family():
    """plan_for_config (shardwise-train's memory check, shardwise-plan --config) on Qwen2 0.5B:
    the published parameters, fp32 model states of DDP = 16 bytes per parameter with Adam."""
    cfg = load("model=qwen2_0_5b", "data.seq_len=16", "training.mixed_precision=no")
    plan = config_plan.plan_for_config(cfg, 80 * 2**30)
    assert plan.params == FAMILIES["qwen2_0_5b"][2]
    row = plan.row("ddp")
    assert row.parameters + row.gradients + row.optimizer_state == 16 * plan.params


def test_strategies_cover_a_family_or_name_the_fix():
    """Llama 3 and Qwen2 have tensor-parallel plans (their heads divide 2); Gemma 3 has none
    and Qwen2 no pipeline split: both refused with what to use instead."""
    load("model=llama3_1b", "data.seq_len=16", "distributed.tensor_parallel_size=2", world=2)
    with pytest.raises(ValueError, match="use ddp, fsdp or zero without a tp axis"):
        load("model=gemma3_1b", "data.seq_len=16", "distributed.tensor_parallel_size=2", world=2)
    with pytest.raises(ValueError, match="no split for model_type 'qwen2'"):
        load("model=qwen2_0_5b", "data.seq_len=16", "distributed.pipeline_parallel_size=2", world=2)
