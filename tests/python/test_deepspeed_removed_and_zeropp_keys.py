"""DeepSpeed keys this project follows DeepSpeed on beyond its own features: the keys DeepSpeed
has removed (MiCS, LoCo, Nebula, ...), refused as the installed DeepSpeed refuses them, and
ZeRO++'s zero_hpz_partition_size read as DeepSpeed reads it. Single process; what the ZeRO++ keys
do in training is in tests/distributed/zeropp_checks.py."""

from __future__ import annotations

import warnings

import pytest
from shardwise.fsdp import ConfigError
from shardwise.zero.config import load


def _removed_by_deepspeed() -> dict[str, dict]:
    """The config keys the installed DeepSpeed refuses because it removed their feature, by
    section, read from its own config module."""
    from deepspeed.runtime import config as ds_config

    return {
        "": dict(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS),
        "zero_optimization": dict(ds_config._REMOVED_ZERO_CONFIG_KEYS),
    }


def test_the_removed_keys_are_deepspeeds_own():
    """Catches the tables drifting from the DeepSpeed the project pins: a key DeepSpeed now
    refuses that shardwise still accepts (or ignores with a warning), or one it refuses that
    DeepSpeed has brought back."""
    from shardwise.zero import deepspeed_keys as K

    removed = _removed_by_deepspeed()
    assert set(K.REMOVED_TOP) == set(removed[""])
    assert set(K.REMOVED_ZERO) == set(removed["zero_optimization"])


@pytest.mark.parametrize(
    "section, key",
    [(s, k) for s, keys in _removed_by_deepspeed().items() for k in sorted(keys)],
)
def test_a_removed_key_is_refused_as_deepspeed_refuses_it(section, key):
    """Each key DeepSpeed has removed (MiCS, LoCo, Nebula, ...), in a config DeepSpeed's own
    DeepSpeedConfig refuses: refused here too, naming the key, before any work. Catches the
    key accepted and ignored (the config trains as something its author did not ask for)."""
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError

    config: dict = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    (config[section] if section else config)[key] = 1
    with pytest.raises(DeepSpeedConfigError) as theirs:
        DeepSpeedConfig(config)
    assert str(theirs.value) == _removed_by_deepspeed()[section][key]  # refused for this key
    path = f"{section}.{key}" if section else key
    with pytest.raises(ConfigError, match=f"^{path}: DeepSpeed has removed .*; remove it$"):
        load(config, 1)


@pytest.mark.parametrize(
    "size, stage, world, read",
    [
        (2, 3, 8, 2),
        (4, 3, 8, 4),
        (0, 3, 8, 1),  # 0 and 1: off
        (1, 3, 8, 1),
        (8, 3, 8, 1),  # the whole world: plain stage 3
        (16, 3, 8, 1),  # min(size, world)
        (2, 2, 8, 1),  # stages 1 and 2 ignore it: named in the warning
        (3, 3, 8, "does not divide the data-parallel world size 8"),
        (-1, 3, 8, "must be an integer >= 0"),
        (2.0, 3, 8, "must be an integer >= 0"),
    ],
)
def test_zero_hpz_partition_size_is_read_as_deepspeed_reads_it(size, stage, world, read):
    """ZeRO++'s hpZ group size as DeepSpeed derives it (min(size, world), dividing the world;
    0 and 1 off; only stage 3 reads it) reaches the engine resolved, and a size DeepSpeed
    refuses (negative, not dividing the world) is refused naming the key. Catches a size that
    does not divide the world failing later inside group creation, and stage 2 silently
    ignoring it."""
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": stage, "zero_hpz_partition_size": size},
    }
    if isinstance(read, str):
        with pytest.raises(ConfigError, match=f"zero_hpz_partition_size.*{read}"):
            load(config, world)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded_config = load(config, world)
    assert loaded_config["zero_optimization"]["zero_hpz_partition_size"] == read
    named = [e for e in loaded_config["ignored"] if e.startswith("zero_optimization.zero_hpz")]
    assert bool(named) == (stage != 3 and size > 1), named
    assert all(any(e in str(w.message) for w in caught) for e in named), caught


def test_deepspeed_refuses_a_negative_hpz_partition_size_too():
    """The one bound DeepSpeed's own schema puts on the key (ge=0), checked against it."""
    import pydantic
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    with pytest.raises(pydantic.ValidationError):
        DeepSpeedZeroConfig(zero_hpz_partition_size=-1)
    assert DeepSpeedZeroConfig(zero_hpz_partition_size=0).zero_hpz_partition_size == 0


@pytest.mark.parametrize("key", ["zero_quantized_weights", "zero_quantized_gradients"])
def test_deterministic_mode_refuses_the_quantized_keys_naming_them(key):
    """Catches deterministic=True accepted beside a quantized collective, whose blocks follow the
    shard size (so the promised bits would change with the data-parallel size): refused before
    any work, naming the key."""
    from shardwise.zero.engine import ZeroEngine
    from torch import nn

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, key: True}}
    with pytest.raises(ConfigError, match=f"^{key} with deterministic=True"):
        ZeroEngine(nn.Linear(4, 4), config, deterministic=True)
