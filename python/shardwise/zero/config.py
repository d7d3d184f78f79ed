"""The DeepSpeed-style ZeRO config: a mapping (or a JSON file) with the keys DeepSpeed users
already write. Unknown keys are errors that list the valid ones and suggest the closest; the batch
sizes follow DeepSpeed's rule train_batch_size = micro × accumulation × data-parallel world."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path

from ..fsdp.config import ConfigError

TOP_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "bf16",
    "fp16",
    "zero_optimization",
    "optimizer",
}
ZERO_KEYS = {
    "stage": 0,
    "overlap_comm": True,
    "contiguous_gradients": True,
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "offload_optimizer": {"device": "none"},
}
OFFLOAD_KEYS = {"device": "none", "pin_memory": False}
OFFLOAD_DEVICES = ("none", "cpu")
BF16_KEYS = {"enabled": False}
FP16_KEYS = {
    "enabled": False,
    "loss_scale": 0.0,  # 0: dynamic
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1.0,
}
OPTIMIZER_TYPES = ("adamw", "adam", "sgd")
OPTIMIZER_PARAMS = {
    "lr": 1e-3,
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "weight_decay": 0.01,
    "momentum": 0.0,
    "dampening": 0.0,
    "nesterov": False,
}


def _check_keys(section: str, given: Mapping, valid) -> None:
    for key in given:
        if key not in valid:
            close = difflib.get_close_matches(str(key), sorted(valid), 1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(
                f"{section}: unknown key '{key}'.{hint} Valid keys: {', '.join(sorted(valid))}"
            )


def _section(section: str, given, defaults: Mapping) -> dict:
    if given is None:
        return dict(defaults)
    if not isinstance(given, Mapping):
        raise ConfigError(f"{section} must be a mapping, got {type(given).__name__}")
    _check_keys(section, given, defaults)
    return {**defaults, **given}


def _positive_int(key: str, value, allow_none: bool = True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def batch_sizes(train: int | None, micro: int | None, accum: int | None, world: int):
    """DeepSpeed's rule: any two of (train_batch_size, micro batch, accumulation) determine the
    third; all three must satisfy train = micro × accumulation × world."""
    if train is not None and micro is not None and accum is not None:
        if train != micro * accum * world:
            raise ConfigError(
                f"train_batch_size {train} != train_micro_batch_size_per_gpu {micro} × "
                f"gradient_accumulation_steps {accum} × data-parallel world {world} "
                f"(= {micro * accum * world}); fix one of them or leave one out"
            )
        return train, micro, accum
    if train is not None and micro is not None:
        accum, rest = divmod(train, micro * world)
    elif train is not None and accum is not None:
        micro, rest = divmod(train, accum * world)
    elif micro is not None:
        accum = accum or 1
        return micro * accum * world, micro, accum
    elif train is not None:
        accum, (micro, rest) = 1, divmod(train, world)
    else:
        raise ConfigError(
            "set train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed needs one)"
        )
    if rest or micro < 1 or accum < 1:
        raise ConfigError(
            f"train_batch_size {train} is not a multiple of the micro batch × accumulation × "
            f"data-parallel world {world}; change train_batch_size or the other two"
        )
    return train, micro, accum


def load(config: Mapping | str | Path, world_size: int) -> dict:
    """The validated config: DeepSpeed's keys with their defaults filled in, plus the options the
    C++ optimizer takes (``native``)."""
    if isinstance(config, str | Path):
        config = json.loads(Path(config).read_text())
    if not isinstance(config, Mapping):
        raise ConfigError(f"the ZeRO config must be a mapping or a JSON file, got {config!r}")
    _check_keys("ZeRO config", config, TOP_KEYS)
    zero = _section("zero_optimization", config.get("zero_optimization"), ZERO_KEYS)
    offload = _section("offload_optimizer", zero["offload_optimizer"], OFFLOAD_KEYS)
    bf16 = _section("bf16", config.get("bf16"), BF16_KEYS)
    fp16 = _section("fp16", config.get("fp16"), FP16_KEYS)
    optimizer = _section("optimizer", config.get("optimizer"), {"type": "AdamW", "params": {}})
    params = _section("optimizer.params", optimizer["params"], OPTIMIZER_PARAMS)
    if zero["stage"] not in (0, 1, 2, 3):
        raise ConfigError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {zero['stage']!r}")
    if offload["device"] not in OFFLOAD_DEVICES:
        raise ConfigError(
            f"offload_optimizer.device '{offload['device']}'; valid: {', '.join(OFFLOAD_DEVICES)}"
        )
    if bf16["enabled"] and fp16["enabled"]:
        raise ConfigError("bf16.enabled and fp16.enabled are both true; enable one of them")
    kind = str(optimizer["type"]).lower()
    if kind not in OPTIMIZER_TYPES:
        raise ConfigError(
            f"optimizer.type '{optimizer['type']}'; valid: AdamW, Adam (decoupled decay), SGD"
        )
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        _positive_int(f"zero_optimization.{key}", int(zero[key]), allow_none=False)
    clip = float(config.get("gradient_clipping", 0.0))
    if clip < 0:
        raise ConfigError(f"gradient_clipping must be >= 0 (0: off), got {clip}")
    train, micro, accum = batch_sizes(
        _positive_int("train_batch_size", config.get("train_batch_size")),
        _positive_int(
            "train_micro_batch_size_per_gpu", config.get("train_micro_batch_size_per_gpu")
        ),
        _positive_int("gradient_accumulation_steps", config.get("gradient_accumulation_steps")),
        world_size,
    )
    scaler = None
    if fp16["enabled"]:
        scale = float(fp16["loss_scale"])
        scaler = {
            "dynamic": scale == 0,
            "initial_scale": 2.0 ** fp16["initial_scale_power"] if scale == 0 else scale,
            "window": int(fp16["loss_scale_window"]),
            "hysteresis": int(fp16["hysteresis"]),
            "min_scale": float(fp16["min_loss_scale"]),
        }
    beta1, beta2 = params["betas"]
    native = {
        "stage": int(zero["stage"]),
        "reduce_bucket_numel": int(zero["reduce_bucket_size"]),
        "overlap_comm": bool(zero["overlap_comm"]),
        "offload_optimizer": offload["device"] == "cpu",
        "gradient_clipping": clip,
        "loss_scaler": scaler,
        "optimizer": {
            "type": "sgd" if kind == "sgd" else "adamw",
            "lr": float(params["lr"]),
            "beta1": float(beta1),
            "beta2": float(beta2),
            "eps": float(params["eps"]),
            "weight_decay": float(params["weight_decay"]),
            "momentum": float(params["momentum"]),
            "dampening": float(params["dampening"]),
            "nesterov": bool(params["nesterov"]),
        },
    }
    return {
        "train_batch_size": train,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "zero_optimization": {**zero, "offload_optimizer": offload},
        "bf16": bf16,
        "fp16": fp16,
        "native": native,
    }
