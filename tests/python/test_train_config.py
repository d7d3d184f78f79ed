"""Tests of ``shardwise.train.config``: value and key errors
(with the dotted path and a suggestion), an FSDP config block taken unchanged, dotted
overrides, the derived batch size and learning rate, and the bundled example configs."""

import math
from pathlib import Path

import pytest
import torch.distributed as dist
from conftest import load_train_config as load
from conftest import train_config_error as error_of
from shardwise.train.config import (
    scale_learning_rate,
    validate,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"

# An FSDP training config's "FSDP Configuration" and "Training Configuration" blocks verbatim.
FSDP_CONFIG_YAML = """\
distributed:
  # Enable FSDP
  use_fsdp: true

  # Sharding strategy
  fsdp_sharding_strategy: "full_shard"  # full_shard, shard_grad_op, no_shard

  # Backward prefetch
  fsdp_backward_prefetch: "backward_pre"  # backward_pre, backward_post

  # Forward prefetch
  fsdp_forward_prefetch: false

  # Auto-wrap policy
  fsdp_auto_wrap_policy: "transformer_auto_wrap"
  fsdp_min_num_params: 1000000  # Minimum parameters for wrapping

  # State dict type for checkpointing
  fsdp_state_dict_type: "full_state_dict"  # full_state_dict, local_state_dict, sharded_state_dict

  # Mixed precision
  fsdp_mixed_precision: true
  fsdp_param_dtype: "bfloat16"
  fsdp_reduce_dtype: "float32"
  fsdp_buffer_dtype: "float32"
"""
FSDP_TRAINING_YAML = """\
training:
  # Increase batch size for multiple GPUs
  batch_size: 64  # Per GPU batch size

  # Adjust learning rate for larger effective batch size
  learning_rate: 2e-4  # Scale with number of GPUs

  # Enable gradient checkpointing for memory efficiency
  gradient_checkpointing: true

  # Use mixed precision
  bf16: true

  # Gradient clipping
  gradient_clip_norm: 1.0
"""


def test_defaults_are_a_single_process_ddp_run():
    cfg = load()
    assert cfg.distributed.strategy == "ddp"
    assert (cfg.distributed.world_size, cfg.distributed.rank, cfg.distributed.local_rank) == (
        1,
        0,
        0,
    )
    assert cfg.distributed.enabled is False
    assert cfg.gpt_config().dim == 64  # the tiny preset


# ---------------------------------------------------------------- bad values and unknown keys


@pytest.mark.parametrize(
    "override, expected",
    [
        ("training.micro_batch_size=0", ["training.micro_batch_size", "0", "greater than 0"]),
        ("training.lr_scaling=cubic", ["training.lr_scaling", "'cubic'", "'linear'"]),
        ("training.learning_rate=fast", ["training.learning_rate", "'fast'"]),
        ("model.preset=huge", ["model.preset", "'huge'", "tiny, small, medium, 1b"]),
        ("data.corpus=wiki", ["data.corpus", "'wiki'", "'pydoc'"]),
        ("distributed.backend=foo", ["distributed.backend", "'foo'", "'gloo'", "'nccl'", "'mpi'"]),
        ("distributed.strategy=tp", ["distributed.strategy", "'tp'", "'pipeline'"]),
        ("distributed.pipeline.schedule=fast", ["distributed.pipeline.schedule", "'zb_h1'"]),
        ("distributed.pipeline.split=bytes", ["distributed.pipeline.split", "'time'"]),
        (
            "distributed.fsdp_sharding_strategy=half",
            ["distributed.fsdp_sharding_strategy", "'half'", "shard_grad_op"],
        ),
        (
            "distributed.fsdp.fsdp_param_dtype=int8",
            ["distributed.fsdp.fsdp_param_dtype", "'int8'", "bfloat16"],
        ),
        (
            "distributed.zero.zero_optimization.stage=5",
            ["distributed.zero", "stage must be 0, 1, 2 or 3", "5"],
        ),
        ("training.checkpoint.keep_last=0", ["training.checkpoint.keep_last", "0"]),
        ("distributed.timeout_s=0", ["distributed.timeout_s", "0", "greater than 0"]),
    ],
)
def test_bad_values_name_key_value_and_fix(override, expected):
    message = error_of(override)
    for part in expected:
        assert part in message, (part, message)


@pytest.mark.parametrize(
    "override, bad_key, suggestion",
    [
        ("training.micro_batch_sze=3", "training.micro_batch_sze", "training.micro_batch_size"),
        ("trainig.seed=1", "trainig", "training"),
        (
            "training.checkpoint.every_step=5",
            "training.checkpoint.every_step",
            "training.checkpoint.every_steps",
        ),
        ("distributed.world_sise=2", "distributed.world_sise", "distributed.world_size"),
        (
            "distributed.fsdp_sharding_strateg=full_shard",
            "distributed.fsdp_sharding_strateg",
            "distributed.fsdp_sharding_strategy",
        ),
        (
            "distributed.fsdp.fsdp_forward_prefech=true",
            "distributed.fsdp.fsdp_forward_prefech",
            "distributed.fsdp.fsdp_forward_prefetch",
        ),
        (
            "distributed.zero.zero_optimisation.stage=2",
            "distributed.zero.zero_optimisation",
            "distributed.zero.zero_optimization",
        ),
        (
            "distributed.pipeline.num_microbatch=4",
            "distributed.pipeline.num_microbatch",
            "distributed.pipeline.num_microbatches",
        ),
    ],
)
def test_unknown_keys_get_a_did_you_mean(override, bad_key, suggestion):
    message = error_of(override)
    assert f"unknown key '{bad_key}'" in message
    assert f"did you mean '{suggestion}'?" in message.lower()


def test_fsdp_config_batch_size_and_micro_batch_size_are_one_setting():
    assert load("training.batch_size=3").training.micro_batch_size == 3
    message = error_of("training.batch_size=3", "training.micro_batch_size=4")
    assert "training.batch_size is given twice" in message


def test_checkpoint_async_and_asynchronous_are_one_setting():
    """The issue's spelling (async, a Python keyword) and the field's (asynchronous) set the
    same key; both at once is an error naming it."""
    assert load("training.checkpoint.async=true").training.checkpoint.asynchronous is True
    assert load("training.checkpoint.asynchronous=true").training.checkpoint.asynchronous
    assert load().training.checkpoint.asynchronous is False
    message = error_of("training.checkpoint.async=true", "training.checkpoint.asynchronous=false")
    assert "given twice" in message


def test_the_collective_timeout_reaches_the_run():
    """distributed.timeout_s is what init_process_group gets (a cut link is noticed only by it:
    the fault soak's link-cut trials); unset, torch's default stays."""
    from shardwise.train import trainer

    class Stop(Exception):
        pass

    seen = {}

    def init_distributed(backend, env, timeout_s):
        seen["timeout_s"] = timeout_s
        raise Stop

    for overrides, expected in ((["distributed.timeout_s=12.5"], 12.5), ([], None)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trainer, "init_distributed", init_distributed)
            with pytest.raises(Stop):
                trainer.TrainingRun(load(*overrides))
        assert seen.pop("timeout_s") == expected


def test_the_shuffle_seed_orders_the_batches():
    """data.shuffle_seed seeds the batches' order (it was parsed and then ignored); unset, the
    order follows training.seed as before."""
    assert load("data.shuffle_seed=5", "training.seed=3").data_seed == 5
    assert load("training.seed=3").data_seed == 3


def test_the_fsdp_sections_gradient_checkpointing_turns_checkpointing_on():
    """distributed.fsdp.gradient_checkpointing was overwritten by training.gradient_checkpointing
    (false by default); either key now turns activation checkpointing on for the run and the
    planner."""
    from shardwise.train.parallelize import StrategyOptions

    cfg = load("distributed.strategy=fsdp", "distributed.fsdp.gradient_checkpointing=true")
    assert cfg.activation_checkpointing and StrategyOptions.from_config(cfg).checkpointing
    assert load("training.gradient_checkpointing=true").activation_checkpointing
    assert not load("distributed.strategy=fsdp").activation_checkpointing


def test_mixed_precision_must_be_set_consistently():
    message = error_of("training.bf16=true", "training.mixed_precision=fp16")
    assert "training.bf16" in message and "training.mixed_precision" in message
    assert load("training.bf16=false").mixed_precision == "no"
    assert load("distributed.mixed_precision=bf16").mixed_precision == "bf16"


def test_mixed_precision_resolves_fsdps_keys_and_ddps_hook():
    """training.mixed_precision bf16/fp16 gives FSDP its own mixed precision in that dtype
    (gradients reduced in fsdp_reduce_dtype) unless the keys say otherwise; ddp_comm_hook is
    DDP's, refused naming the strategy elsewhere."""
    from shardwise.train.parallelize import StrategyOptions

    keys = StrategyOptions.from_config(load("training.mixed_precision=fp16")).fsdp
    assert keys["fsdp_mixed_precision"] and keys["fsdp_param_dtype"] == "float16", keys
    assert "fsdp_reduce_dtype" not in keys  # FSDPConfig's default (float32) applies
    off = load("training.mixed_precision=bf16", "distributed.fsdp.fsdp_mixed_precision=false")
    assert StrategyOptions.from_config(off).fsdp["fsdp_mixed_precision"] is False
    assert "fsdp_mixed_precision" not in StrategyOptions.from_config(load()).fsdp
    assert (
        StrategyOptions.from_config(load("distributed.ddp_comm_hook=bf16")).ddp_comm_hook == "bf16"
    )
    message = error_of("distributed.strategy=fsdp", "distributed.ddp_comm_hook=fp16")
    assert "distributed.ddp_comm_hook" in message and "strategy=fsdp" in message


def test_strategy_conflicts_with_sub_blocks():
    message = error_of("distributed.strategy=ddp", "distributed.zero.zero_optimization.stage=2")
    assert "distributed.zero" in message and "strategy=ddp" in message
    message = error_of(
        "distributed.world_size=2",
        "distributed.pipeline_parallel_size=2",
        "distributed.strategy=fsdp",
    )
    assert "distributed.strategy=fsdp" in message


def test_zero_block_batch_sizes_are_checked_against_training():
    message = error_of(
        "distributed.zero.train_batch_size=10",
        "training.micro_batch_size=4",
        env={"WORLD_SIZE": "2"},
    )
    assert "distributed.zero" in message and "train_batch_size 10" in message
    cfg = load(
        "distributed.zero.train_batch_size=16",
        "training.micro_batch_size=4",
        "training.gradient_accumulation_steps=2",
        env={"WORLD_SIZE": "2"},
    )
    assert cfg.distributed.strategy == "zero"
    assert cfg.zero_config()["train_batch_size"] == 16 == cfg.effective_batch_size


DEEPSPEED = Path(__file__).resolve().parents[1] / "data" / "deepspeed"


def test_a_deepspeed_json_file_is_the_zero_block_with_auto_from_training():
    """Catches (issue 17): Hugging Face's ds_config_zero2.json refused by shardwise-train, or
    its "auto" values left unresolved instead of taken from the training section."""
    cfg = load(
        f"distributed.zero={DEEPSPEED / 'hf_transformers_ds_config_zero2.json'}",
        "training.micro_batch_size=4",
        "training.learning_rate=5e-4",
        "training.mixed_precision=bf16",
        "training.warmup_steps=7",
        env={"WORLD_SIZE": "2"},
    )
    zero = cfg.zero_config()
    assert cfg.distributed.strategy == "zero"
    assert zero["train_batch_size"] == 8 and zero["bf16"]["enabled"]
    assert zero["native"]["optimizer"]["lr"] == 5e-4 and zero["native"]["offload_optimizer"]
    assert zero["schedule"]["warmup_num_steps"] == 7
    assert zero["schedule"]["warmup_max_lr"] == 5e-4


def test_deepspeed_values_the_trainer_also_sets_must_agree():
    """Catches: a DeepSpeed lr or clipping silently overridden by the trainer's every step."""
    assert "differs from the trainer's learning rate" in error_of(
        "distributed.zero.optimizer.params.lr=0.01", "training.learning_rate=3e-4"
    )
    assert "training.gradient_clip_norm" in error_of(
        "distributed.zero.gradient_clipping=0.5", "training.gradient_clip_norm=1.0"
    )
    assert "cannot read the DeepSpeed config" in error_of("distributed.zero=/nonexistent.json")


def test_pipeline_effective_batch_counts_the_microbatches():
    """training.micro_batch_size is one pipeline microbatch: a step of a 2 x 2 dp x pp mesh
    with 4 microbatches of 3 and accumulation 2 sees 3 * 4 * 2 * 2 sequences."""
    cfg = load(
        "distributed.world_size=4",
        "model.mesh_shape=[[2,2],[dp,pp]]",
        "training.micro_batch_size=3",
        "training.gradient_accumulation_steps=2",
        "distributed.pipeline.num_microbatches=4",
    )
    assert cfg.distributed.strategy == "pipeline"
    assert cfg.effective_batch_size == 3 * 4 * 2 * 2


def test_data_seq_len_cannot_exceed_the_model():
    message = error_of("data.seq_len=65")  # tiny: seq_len 64
    assert "data.seq_len=65" in message and "seq_len=64" in message


# ---------------------------------------------------------------- the FSDP config, overrides, YAML


def test_an_fsdp_config_block_is_accepted_unchanged(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text(FSDP_CONFIG_YAML + FSDP_TRAINING_YAML)
    cfg = load(path=str(path), env={"WORLD_SIZE": "4"})
    assert cfg.distributed.strategy == "fsdp"
    fsdp = cfg.fsdp_config()
    assert fsdp.fsdp_sharding_strategy == "full_shard"
    assert fsdp.fsdp_min_num_params == 1_000_000
    assert fsdp.fsdp_mixed_precision is True and fsdp.fsdp_param_dtype == "bfloat16"
    assert fsdp.fsdp_backward_prefetch == "backward_pre" and fsdp.fsdp_forward_prefetch is False
    assert cfg.training.micro_batch_size == 64  # the FSDP config's per-GPU "batch_size"
    assert cfg.training.learning_rate == pytest.approx(2e-4)
    assert cfg.mixed_precision == "bf16" and cfg.training.gradient_checkpointing
    assert cfg.effective_batch_size == 64 * 4


def test_dotted_overrides_with_the_mesh_list_syntax(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("training:\n  micro_batch_size: 2\n  seed: 7\n")
    cfg = load(
        "training.micro_batch_size=8",
        'model.mesh_shape=[[2,1],["fsdp","tp"]]',
        path=str(path),
        env={"WORLD_SIZE": "2"},
    )
    assert cfg.training.micro_batch_size == 8 and cfg.training.seed == 7
    assert cfg.model.mesh_shape == [[2, 1], ["fsdp", "tp"]]
    assert cfg.distributed.strategy == "fsdp"  # an fsdp axis > 1
    assert cfg.data_parallel_size == 2


def test_model_preset_shorthand_and_field_overrides():
    cfg = load("model=small", "model.layers=2")
    gpt = cfg.gpt_config()
    assert (gpt.dim, gpt.layers, gpt.vocab_size) == (512, 2, 8192)


def test_model_selection_replaces_the_model_section(capsys):
    """``model=NAME`` selects like a Hydra config group. Catches the selection merged into the
    file's model section, which kept demo.yaml's ``model.dim`` beside a model family and refused
    the run ("model.dim sizes the bundled GPT")."""
    demo = str(EXAMPLES / "demo.yaml")
    cfg = load("model=gemma3_1b", "model.hf_overrides.num_hidden_layers=1", path=demo)
    assert cfg.model.hf_config == "gemma3_1b" and cfg.model.dim is None
    assert cfg.model.hf_overrides == {"num_hidden_layers": 1}
    assert cfg.training.max_steps == 400 and cfg.distributed.strategy == "fsdp"  # kept
    printed = capsys.readouterr().err
    assert "model=gemma3_1b replaces the config's model section" in printed
    assert "model.dim=192" in printed and "model.preset=tiny" in printed
    small = load("model=small", path=demo).gpt_config()
    assert (small.dim, small.layers) == (512, 6)  # the preset's, not demo.yaml's 192 x 4
    kept = load('model.mesh_shape=[[2,1],["fsdp","tp"]]', "model=small", env={"WORLD_SIZE": "2"})
    assert kept.model.mesh_shape == [[2, 1], ["fsdp", "tp"]]


def test_malformed_override_is_reported():
    assert "override 'training.seed'" in error_of("training.seed")


def test_to_yaml_round_trips_without_per_process_ranks(tmp_path):
    cfg = load(
        "training.lr_scaling=sqrt",
        "training.base_batch_size=8",
        "distributed.use_fsdp=true",
        env={"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"},
    )
    text = cfg.to_yaml()
    assert "rank: null" in text and "fsdp:" in text
    path = tmp_path / "saved.yaml"
    path.write_text(text)
    again = load(path=str(path), env={"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert again.to_dict() == cfg.to_dict()
    assert again.scaled_learning_rate == cfg.scaled_learning_rate


# ---------------------------------------------------------------- derived values


def test_effective_batch_size_is_micro_times_accumulation_times_data_parallel():
    cfg = load(
        "training.micro_batch_size=4",
        "training.gradient_accumulation_steps=3",
        env={"WORLD_SIZE": "4"},
    )
    assert cfg.effective_batch_size == 4 * 3 * 4
    pipelined = load(
        "training.micro_batch_size=4",
        "training.gradient_accumulation_steps=3",
        'model.mesh_shape=[[2,2],["dp","pp"]]',
        env={"WORLD_SIZE": "4"},
    )
    assert pipelined.data_parallel_size == 2
    # pipeline stages share a batch; each step has num_microbatches (default: p = 2) of 4
    assert pipelined.effective_batch_size == 4 * 2 * 3 * 2


def test_learning_rate_scaling_math():
    assert scale_learning_rate(1e-3, 64, 16, "none") == 1e-3
    assert scale_learning_rate(1e-3, 64, 16, "linear") == pytest.approx(4e-3)
    assert scale_learning_rate(1e-3, 64, 16, "sqrt") == pytest.approx(2e-3)
    assert scale_learning_rate(1e-3, 8, 32, "sqrt") == pytest.approx(1e-3 * math.sqrt(0.25))
    base = ["training.learning_rate=0.001", "training.base_batch_size=16"]
    env = {"WORLD_SIZE": "8"}  # effective batch 8 × 1 × 8 = 64
    linear = load(*base, "training.lr_scaling=linear", "training.micro_batch_size=8", env=env)
    sqrt = load(*base, "training.lr_scaling=sqrt", "training.micro_batch_size=8", env=env)
    assert linear.scaled_learning_rate == pytest.approx(4e-3)
    assert sqrt.scaled_learning_rate == pytest.approx(2e-3)


def test_lr_scaling_needs_a_base_batch_size():
    message = error_of("training.lr_scaling=linear")
    assert "training.base_batch_size" in message


def test_validation_touches_no_process_group(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("config validation must not call torch.distributed")

    for name in ("init_process_group", "new_group", "get_world_size", "get_rank"):
        monkeypatch.setattr(dist, name, forbidden)
    cfg = load(path=str(EXAMPLES / "dp_x_pp.yaml"))
    assert cfg.distributed.strategy == "pipeline"


# ---------------------------------------------------------------- the example configs

EXPECTED_STRATEGY = {
    "ddp.yaml": "ddp",
    "fsdp.yaml": "fsdp",
    "zero2.yaml": "zero",
    "pipeline_1f1b.yaml": "pipeline",
    "dp_x_pp.yaml": "pipeline",
    "demo.yaml": "fsdp",
    "fsdp_x_tp.yaml": "fsdp",
    "dp_pp_tp.yaml": "pipeline",
    "hf_llama.yaml": "fsdp",
}


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(EXPECTED_STRATEGY)


@pytest.mark.parametrize("name", sorted(EXPECTED_STRATEGY))
def test_example_configs_load(name):
    cfg = load(path=str(EXAMPLES / name))
    assert cfg.distributed.strategy == EXPECTED_STRATEGY[name]
    assert cfg.distributed.backend == "shardwise"
    assert cfg.model.preset in ("tiny", "small")
    assert validate(cfg.to_dict(), env={}).to_dict() == cfg.to_dict()


def test_bare_no_is_the_precision_word_not_false():
    """YAML 1.1 reads ``mixed_precision: no`` (and the override ``=no``) as false."""
    assert load("training.mixed_precision=no").mixed_precision == "no"


def test_fp16_runs_with_every_strategy():
    """fp16 used to need ZeRO's loss scaler; every strategy has the GradScaler now."""
    for strategy in ("ddp", "fsdp"):
        cfg = load("training.mixed_precision=fp16", f"distributed.strategy={strategy}")
        assert cfg.mixed_precision == "fp16" and cfg.training.initial_loss_scale_power == 16
    message = error_of("training.mixed_precision=fp16", "training.initial_loss_scale_power=65")
    assert "training.initial_loss_scale_power" in message
    cfg = load(
        "training.mixed_precision=fp16",
        "distributed.strategy=zero",
        "distributed.zero.zero_optimization.stage=2",
    )
    assert cfg.mixed_precision == "fp16"


def test_dp_by_fsdp_mesh_runs_hybrid_or_is_refused():
    """[[2,2],["dp","fsdp"]] used to run as full sharding over all 4 ranks, silently."""
    mesh = 'model.mesh_shape=[[2,2],["dp","fsdp"]]'
    message = error_of("distributed.world_size=4", mesh)
    assert "hybrid sharding" in message and "fsdp_sharding_strategy=hybrid_shard" in message
    cfg = load(
        "distributed.world_size=4",
        mesh,
        "distributed.strategy=fsdp",
        "distributed.fsdp.fsdp_sharding_strategy=hybrid_shard",
    )
    assert cfg.fsdp_config().mesh_shape == ((2, 2), ("dp", "fsdp"))


def test_zb_h1_with_fsdp_x_pp_is_refused_before_start():
    message = error_of(
        "distributed.world_size=4",
        'model.mesh_shape=[[2,2],["fsdp","pp"]]',
        "distributed.pipeline.schedule=zb_h1",
    )
    assert "zb_h1 with an fsdp x pp mesh" in message and "1f1b" in message


def test_zero_and_fsdp_pipelines_compose_with_tp():
    """ZeRO over the dp axis of a tp model and FSDP-sharded pipeline stages of tp layers (both
    refused before the one train step) validate; ZeRO keeps the strategy and the data size."""
    cfg = load(
        "distributed.world_size=4",
        'model.mesh_shape=[[2,2],["dp","tp"]]',
        "distributed.strategy=zero",
    )
    assert cfg.distributed.strategy == "zero" and cfg.data_parallel_size == 2
    cfg = load(
        "distributed.world_size=8",
        'model.mesh_shape=[[2,2,2],["fsdp","pp","tp"]]',
        "distributed.strategy=pipeline",
    )
    assert cfg.layout().data_axis("pipeline") == "fsdp"
    assert cfg.distributed.tensor_parallel_size == 2


def test_zb_h1_with_tp_is_refused_and_split_by_time_accepted():
    """zb_h1 defers plain nn.Linear weight gradients, not tp layers': refused with the fix;
    split=time with tp validates (rank 0 times a tp copy over a do-nothing group)."""
    mesh = 'model.mesh_shape=[[2,2],["pp","tp"]]'
    message = error_of(
        "distributed.world_size=4",
        mesh,
        "distributed.strategy=pipeline",
        "distributed.pipeline.schedule=zb_h1",
    )
    assert "schedule other than zb_h1" in message
    cfg = load(
        "distributed.world_size=4",
        mesh,
        "distributed.strategy=pipeline",
        "distributed.pipeline.split=time",
    )
    assert cfg.distributed.pipeline.split == "time"
