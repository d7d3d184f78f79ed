"""``shardwise-train``'s command line: dotted overrides before and after the flags,
``--distributed`` (a process launched by hand must know its place in the job before it starts),
and ``training.sync_gradients_every``, checked at validation."""

from __future__ import annotations

import pytest
from shardwise.train import cli
from shardwise.train.config import load_config


def test_overrides_may_follow_the_flags():
    args = cli.parse_args(
        ["training.max_steps=3", "--no-resume", "model.preset=tiny", "--distributed", "x.y=1"]
    )
    assert args.overrides == ["training.max_steps=3", "model.preset=tiny", "x.y=1"]
    assert args.no_resume and args.distributed


def test_distributed_names_what_the_process_does_not_know():
    cfg = load_config(None, ["distributed.enabled=true"], env={}, cuda_devices=0)
    with pytest.raises(ValueError, match="MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK") as info:
        cli.check_launch(cfg, env={})
    assert "distributed.master_addr" in str(info.value) and "torchrun" in str(info.value)
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "RANK": "4"}
    cfg = load_config(None, ["distributed.enabled=true"], env=env, cuda_devices=0)
    cli.check_launch(cfg, env=env)  # the launcher's exported variables
    by_config = [
        "distributed.world_size=2", "distributed.rank=1", "distributed.master_addr=127.0.0.1",
        "distributed.master_port=29511",
    ]  # fmt: skip
    cli.check_launch(load_config(None, by_config, env={}, cuda_devices=0), env={})


def test_a_missing_launch_variable_exits_before_any_work(capsys, monkeypatch):
    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)  # an earlier in-process run may have set them
    assert cli.main(["--distributed", "training.max_steps=1", "training.warmup_steps=0"]) == 2
    assert "--distributed (distributed.enabled): this process does not" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["distributed.enabled=true", "distributed.world_size=2"])
def test_the_enabled_key_or_a_larger_world_asks_the_same_as_the_flag(capsys, monkeypatch, key):
    """distributed.enabled=true in the config (or a world of two, which implies it) is
    --distributed: a process that does not know its place exits with code 2 naming what it
    lacks, before any work (with the key ignored, one process would train alone, or a world of
    two would wait at the rendezvous for a rank that never comes)."""
    for var in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    assert cli.main([key, "training.max_steps=1", "training.warmup_steps=0"]) == 2
    assert "this process does not know MASTER_ADDR" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.gradient_accumulation_steps=4", "training.sync_gradients_every=3"],
         "must divide training.gradient_accumulation_steps=4"),
        (["training.gradient_accumulation_steps=4", "training.sync_gradients_every=2",
          "distributed.strategy=zero"], "ZeRO reduces every micro-batch"),
    ],
)  # fmt: skip
def test_sync_gradients_every_is_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides, env={}, cuda_devices=0)


def test_sync_points():
    from shardwise.train.step import sync_points

    assert sync_points(4, None) == {3}
    assert sync_points(4, 2) == {1, 3}
    assert sync_points(4, 1) == {0, 1, 2, 3}
    assert sync_points(1, None) == {0}


def test_the_fsdp_guides_boolean_keys_are_flags():
    """``--use-fsdp`` (the FSDP guide's launch line) and every other boolean key written flat in
    a config is a flag setting that key, with ``--no-`` for false; a dotted override given too
    wins. Catches a flag parsed and not turned into its key."""
    assert cli.BOOLEAN_FLAGS["use-fsdp"] == "distributed.use_fsdp"
    for flag in ("fsdp-forward-prefetch", "fsdp-mixed-precision", "bf16", "gradient-checkpointing"):
        assert flag in cli.BOOLEAN_FLAGS, sorted(cli.BOOLEAN_FLAGS)
    args = cli.parse_args(["--use-fsdp", "training.max_steps=3", "--no-fsdp-forward-prefetch"])
    assert args.overrides == [
        "distributed.use_fsdp=true",
        "distributed.fsdp_forward_prefetch=false",
        "training.max_steps=3",
    ]

    def resolved(*argv):
        args = cli.parse_args([*argv, "distributed.world_size=2"])
        return load_config(args.config, args.overrides, env={}, cuda_devices=0)

    assert resolved().distributed.strategy == "ddp"
    assert resolved("--use-fsdp").distributed.strategy == "fsdp"
    cfg = resolved("--use-fsdp", "--fsdp-forward-prefetch", "--gradient-checkpointing")
    assert cfg.fsdp_config().fsdp_forward_prefetch and cfg.training.gradient_checkpointing
    assert resolved("--bf16").mixed_precision == "bf16"
    assert resolved("--bf16", "training.bf16=false").mixed_precision == "no"
    with pytest.raises(SystemExit):
        cli.parse_args(["--use_fsdp"])  # argparse names the unknown flag and exits 2
