"""DeepSpeed's config as people write it: a mapping or a JSON file (``ds_config.json``).

- The documented keys of the features ``shardwise.zero`` has are implemented (``deepspeed_keys``
  lists them with DeepSpeed's defaults), including the deprecated spellings (``cpu_offload``,
  ``cpu_offload_param``), ``scheduler`` (WarmupLR, WarmupDecayLR, WarmupCosineLR, computed in C++:
  ``csrc/optim/warmup_schedule.h``), ``prescale_gradients`` and ``gradient_predivide_factor``.
- The documented keys of features it does not have are accepted, and named in one warning
  (``DeepSpeedConfigWarning``) with what is ignored; values that would change the results
  (NVMe offload, coupled weight decay, AMSGrad) are errors instead.
- Keys DeepSpeed itself has removed (MiCS, LoCo, Nebula, ...) are refused, as DeepSpeed refuses
  them, naming what replaces them.
- Any other key is a misspelling: an error that suggests the closest valid key.
- ``"auto"`` values are filled from ``auto`` (what Hugging Face's Trainer fills them from: batch
  sizes, lr, betas, eps, weight_decay, clipping, fp16/bf16, the warmup and total steps, and the
  bucket sizes from the model's hidden size); an ``"auto"`` with nothing to fill it is an error
  naming the key.
- The batch sizes follow DeepSpeed's rule train_batch_size = micro × accumulation × world.
"""

from __future__ import annotations

import difflib
import json
import math
import warnings
from collections.abc import Mapping
from pathlib import Path

from ..fsdp.config import ConfigError
from . import deepspeed_keys as K

TOP_KEYS = set(K.TOP) | set(K.IGNORED_TOP)


class DeepSpeedConfigWarning(UserWarning):
    """Documented DeepSpeed keys that ``shardwise.zero`` accepts and ignores."""


def _refuse_removed(section: str, given, removed: Mapping) -> None:
    """Keys DeepSpeed itself has removed: it refuses a config holding one, and so does this."""
    if not isinstance(given, Mapping):
        return
    for key in given:
        if key in removed:
            path = f"{section}.{key}" if section else key
            raise ConfigError(
                f"{path}: DeepSpeed has removed {removed[key]}, and refuses a config with this "
                "key; remove it"
            )


def _hpz_partition_size(zero: Mapping, world_size: int, lost: list) -> int:
    """ZeRO++'s hpZ group size as DeepSpeed reads zero_hpz_partition_size: min(size, world) ranks
    in each group, which must divide the world; 0 and 1 are off, and a group of the whole world
    is plain stage 3. 1 where it is off. Only stage 3 partitions the parameters: DeepSpeed's
    stages 1 and 2 ignore the key, so it is named as ignored there."""
    size = zero["zero_hpz_partition_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ConfigError(
            "zero_optimization.zero_hpz_partition_size must be an integer >= 0 (0 or 1: off), "
            f"got {size!r}"
        )
    size = min(size, world_size)
    if size > 1 and world_size % size:
        raise ConfigError(
            f"zero_optimization.zero_hpz_partition_size={size} does not divide the data-parallel "
            f"world size {world_size} (DeepSpeed asserts the same); use a factor of it, such as "
            "the ranks per host"
        )
    if size > 1 and zero["stage"] != 3:
        lost.append(
            f"zero_optimization.zero_hpz_partition_size={size} (only stage 3 partitions the "
            "parameters; DeepSpeed's stages 1 and 2 ignore it too)"
        )
        return 1
    return size if 1 < size < world_size else 1


def _check_keys(section: str, given: Mapping, valid, ignored: Mapping, lost: list) -> None:
    for key in given:
        if key in ignored:
            lost.append(
                f"{section}.{key} ({ignored[key]})" if section else f"{key} ({ignored[key]})"
            )
        elif key not in valid:
            names = sorted(set(valid) | set(ignored))
            close = difflib.get_close_matches(str(key), names, 1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            where = section or "DeepSpeed config"
            raise ConfigError(
                f"{where}: unknown key '{key}'.{hint} Valid keys: {', '.join(sorted(valid))}"
            )


# The kind of the keys whose default is None (any other None default is checked where used).
_KIND_OF_NONE_DEFAULTS = {
    "scheduler": {},
    "offload_optimizer": {},
    "offload_param": {},
    "cpu_offload": False,
    "cpu_offload_param": False,
    "cpu_offload_params": False,
    "fused": False,
    "foreach": False,
    "warmup_max_lr": 0.0,
    "total_num_steps": 0,
}


def _check_types(section: str, given: Mapping, defaults: Mapping) -> None:
    """Each given value has its default's kind: a bool, a finite number, a string, a mapping, or
    a list of numbers as long as the default's (None stands for the default where it is one)."""
    for key, value in given.items():
        if key not in defaults or value is None and defaults[key] is None:
            continue
        default, where = defaults[key], f"{section}.{key}" if section else key
        if default is None:
            if key not in _KIND_OF_NONE_DEFAULTS:
                continue
            default = _KIND_OF_NONE_DEFAULTS[key]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, int | float):
            ok, kind = number and math.isfinite(value), "a finite number"
        elif isinstance(default, str):
            ok, kind = isinstance(value, str), "a string"
        elif isinstance(default, Mapping):
            ok, kind = value is None or isinstance(value, Mapping), "a mapping"
        else:  # a tuple of numbers (betas)
            ok = isinstance(value, list | tuple) and len(value) == len(default)
            ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            kind = f"a list of {len(default)} numbers"
        if not ok:
            raise ConfigError(f"{where} must be {kind}, got {value!r}")


def _section(section, given, defaults: Mapping, lost: list, ignored: Mapping = None) -> dict:
    if given is None:
        return dict(defaults)
    if not isinstance(given, Mapping):
        raise ConfigError(f"{section} must be a mapping, got {type(given).__name__}")
    ignored = ignored or {}
    _check_keys(section, given, defaults, ignored, lost)
    _check_types(section, given, defaults)
    return {**defaults, **{k: v for k, v in given.items() if k not in ignored}}


def _fill_auto(config, auto: Mapping, path: str = ""):
    """A copy of ``config`` with every "auto" replaced from ``auto`` (by AUTO_SOURCES)."""
    if isinstance(config, Mapping):
        return {k: _fill_auto(v, auto, f"{path}.{k}" if path else k) for k, v in config.items()}
    if config != "auto":
        return config
    source = K.AUTO_SOURCES.get(path)
    if source is None or auto.get(source) is None:
        where = f"the trainer's {source!r}" if source else "nothing shardwise knows"
        raise ConfigError(
            f'{path}: "auto" is filled from {where}, which was not given; write the value, or '
            "pass it in auto= (shardwise-train fills it from its training section)"
        )
    return auto[source]


def _positive_int(key: str, value, allow_none: bool = True):
    if value is None and allow_none:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
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


def _offloads(zero: dict, lost: list) -> tuple[dict, dict]:
    """offload_optimizer and offload_param, with the deprecated booleans folded in."""
    legacy = {"offload_optimizer": "cpu_offload", "offload_param": "cpu_offload_param"}
    out = {}
    for key, defaults in (
        ("offload_optimizer", K.OFFLOAD_OPTIMIZER),
        ("offload_param", K.OFFLOAD_PARAM),
    ):
        section = _section(f"zero_optimization.{key}", zero[key], defaults, lost, K.IGNORED_OFFLOAD)
        old = zero[legacy[key]]
        if key == "offload_param" and zero["cpu_offload_params"] is not None:
            old = zero["cpu_offload_params"]
        if old and section["device"] == "none":
            section["device"] = "cpu"
        if section["device"] not in K.OFFLOAD_DEVICES:
            raise ConfigError(
                f"zero_optimization.{key}.device '{section['device']}': shardwise offloads to "
                f"the CPU only; valid: {', '.join(K.OFFLOAD_DEVICES)}"
            )
        out[key] = section
    if out["offload_param"]["device"] == "cpu" and zero["stage"] != 3:
        raise ConfigError(
            "zero_optimization.offload_param needs stage 3 (the parameters are sharded only "
            "there); set stage 3 or use offload_optimizer"
        )
    return out["offload_optimizer"], out["offload_param"]


def _unimplemented_choices(zero: Mapping) -> list[str]:
    """Keys whose value asks for a behaviour shardwise does not have, each named with what runs
    instead (an absent key is DeepSpeed's default, which is what runs)."""
    lost = []
    if not zero["contiguous_gradients"]:
        lost.append(
            "zero_optimization.contiguous_gradients=false (gradients are always packed into "
            "their bucket's contiguous buffer)"
        )
    return lost


def _optimizer(config: Mapping, lost: list) -> dict:
    optimizer = _section(
        "optimizer", config.get("optimizer"), {"type": "AdamW", "params": {}}, lost
    )
    params = _section("optimizer.params", optimizer["params"], K.OPTIMIZER_PARAMS, lost)
    kind = K.OPTIMIZER_TYPES.get(str(optimizer["type"]).lower())
    if kind is None:
        raise ConfigError(
            f"optimizer.type '{optimizer['type']}': shardwise has AdamW, Adam (decoupled weight "
            "decay, as DeepSpeed's Adam by default), SGD and Lamb"
        )
    given = optimizer["params"] if isinstance(optimizer["params"], Mapping) else {}
    if kind == "adamw":
        _adam_flags(params)
    if kind == "lamb" and params["max_grad_norm"]:
        raise ConfigError(
            f"optimizer.params.max_grad_norm={params['max_grad_norm']!r}: Lamb's own clipping "
            "is not supported; set gradient_clipping (the global norm, over every rank) instead"
        )
    for key in given:
        if key not in K.OPTIMIZER_READS[kind]:  # DeepSpeed's choice of kernel, another type's
            lost.append(f"optimizer.params.{key} (not read by the C++ fused {kind})")
    beta1, beta2 = params["betas"]
    return {
        "type": kind,
        "lr": float(params["lr"]),
        "beta1": float(beta1),
        "beta2": float(beta2),
        "eps": float(params["eps"]),
        "weight_decay": float(params["weight_decay"]),
        "momentum": float(params["momentum"]),
        "dampening": float(params["dampening"]),
        "nesterov": bool(params["nesterov"]),
        "bias_correction": bool(params["bias_correction"]),
        "eps_inside_sqrt": bool(params["eps_inside_sqrt"]),
        "max_coeff": float(params["max_coeff"]),
        "min_coeff": float(params["min_coeff"]),
    }


def _adam_flags(params: Mapping) -> None:
    """DeepSpeed's Adam flags the fused AdamW has one value of."""
    for key, allowed in (("adam_w_mode", True), ("bias_correction", True), ("amsgrad", False)):
        if bool(params[key]) != allowed and not (
            key == "adam_w_mode" and not params["weight_decay"]
        ):
            raise ConfigError(
                f"optimizer.params.{key}={params[key]!r} is not supported (the fused AdamW has "
                f"{key}={allowed}); drop it"
            )


def _scheduler(config: Mapping, lr: float, lost: list) -> dict | None:
    given = config.get("scheduler")
    if given is None:
        return None
    scheduler = _section("scheduler", given, {"type": None, "params": {}}, lost)
    if scheduler["type"] not in K.SCHEDULER_TYPES:
        raise ConfigError(
            f"scheduler.type '{scheduler['type']}': shardwise has {', '.join(K.SCHEDULER_TYPES)}"
        )
    takes = K.SCHEDULER_KEYS[scheduler["type"]]
    given = scheduler["params"] or {}
    for key in given:
        if key in K.SCHEDULER_PARAMS and key not in takes:  # DeepSpeed: a TypeError
            raise ConfigError(
                f"scheduler.params.{key}: {scheduler['type']} does not take it; it takes "
                f"{', '.join(takes)}"
            )
    params = _section("scheduler.params", given, K.SCHEDULER_PARAMS, lost)
    if scheduler["type"] != "WarmupLR" and params["total_num_steps"] is None:
        raise ConfigError(f"scheduler.params.total_num_steps is required by {scheduler['type']}")
    options = {
        "type": scheduler["type"],
        "warmup_min_lr": float(params["warmup_min_lr"]),
        "warmup_max_lr": float(lr if params["warmup_max_lr"] is None else params["warmup_max_lr"]),
        "warmup_num_steps": int(params["warmup_num_steps"]),
        "warmup_type": str(params["warmup_type"]),
        "total_num_steps": int(params["total_num_steps"] or 0),
        "base_lr": float(lr),
        "warmup_min_ratio": float(params["warmup_min_ratio"]),
        "cos_min_ratio": float(params["cos_min_ratio"]),
        "last_batch_iteration": int(params["last_batch_iteration"]),
    }
    from .. import _C

    try:
        _C.WarmupSchedule(options)  # the C++ checks, naming the key
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return options


def _fp16_scaler(fp16: dict) -> dict | None:
    if not fp16["enabled"]:
        return None
    scale = float(fp16["loss_scale"])
    return {
        "dynamic": scale == 0,
        "initial_scale": 2.0 ** fp16["initial_scale_power"] if scale == 0 else scale,
        "window": int(fp16["loss_scale_window"]),
        "hysteresis": int(fp16["hysteresis"]),
        "min_scale": float(fp16["min_loss_scale"]),
    }


def read(config: Mapping | str | Path) -> Mapping:
    """The config as given: a mapping, or the JSON file it names (not yet validated)."""
    if isinstance(config, str | Path):
        try:
            config = json.loads(Path(config).read_text())
        except json.JSONDecodeError as error:
            raise ConfigError(f"DeepSpeed config {config}: not valid JSON ({error})") from None
    if not isinstance(config, Mapping):
        raise ConfigError(f"the ZeRO config must be a mapping or a JSON file, got {config!r}")
    return config


def load(config: Mapping | str | Path, world_size: int, auto: Mapping | None = None) -> dict:
    """The validated config: DeepSpeed's keys with their defaults filled in, plus the options the
    C++ optimizer takes (``native``) and the scheduler's (``schedule``, or None)."""
    config = read(config)
    auto = auto or {}
    config = _fill_auto(config, auto)
    batch_keys = (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    )
    if not any(k in config for k in batch_keys) and auto.get(batch_keys[1]) is not None:
        # as Hugging Face's Trainer: the batch comes from the trainer when the file has none
        config = {**config, **{k: auto[k] for k in batch_keys[1:] if auto.get(k) is not None}}
    lost: list[str] = []
    _refuse_removed("", config, K.REMOVED_TOP)
    _refuse_removed("zero_optimization", config.get("zero_optimization"), K.REMOVED_ZERO)
    _check_keys("", config, K.TOP, K.IGNORED_TOP, lost)
    _check_types("", config, K.TOP)
    zero = _section(
        "zero_optimization", config.get("zero_optimization"), K.ZERO, lost, K.IGNORED_ZERO
    )
    bf16 = _section("bf16", config.get("bf16"), K.BF16, lost, K.IGNORED_BF16)
    fp16 = _section("fp16", config.get("fp16"), K.FP16, lost, K.IGNORED_FP16)
    if zero["stage"] not in (0, 1, 2, 3):
        raise ConfigError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {zero['stage']!r}")
    zero["zero_hpz_partition_size"] = _hpz_partition_size(zero, world_size, lost)
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        if zero[key] and zero["stage"] != 3:  # ZeRO++ is built on stage 3
            lost.append(f"zero_optimization.{key}=true (ZeRO++ runs at stage 3 only; "
                        "DeepSpeed's stages 1 and 2 ignore it too)")  # fmt: skip
            zero[key] = False
    offload, offload_param = _offloads(zero, lost)
    if not zero["allgather_partitions"]:
        lost.append("zero_optimization.allgather_partitions=false (parameters are all-gathered)")
    if not zero["reduce_scatter"]:
        lost.append("zero_optimization.reduce_scatter=false (gradients are reduce-scattered)")
    lost.extend(_unimplemented_choices(zero))
    if bf16["enabled"] and fp16["enabled"]:
        raise ConfigError("bf16.enabled and fp16.enabled are both true; enable one of them")
    optimizer = _optimizer(config, lost)
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        if float(zero[key]) < 0:
            raise ConfigError(f"zero_optimization.{key} must be >= 0, got {zero[key]!r}")
    clip = float(config.get("gradient_clipping", 0.0))
    if clip < 0:
        raise ConfigError(f"gradient_clipping must be >= 0 (0: off), got {clip}")
    predivide = float(config.get("gradient_predivide_factor", 1.0))
    if predivide <= 0:
        raise ConfigError(f"gradient_predivide_factor must be > 0, got {predivide}")
    train, micro, accum = batch_sizes(
        _positive_int("train_batch_size", config.get("train_batch_size")),
        _positive_int(
            "train_micro_batch_size_per_gpu", config.get("train_micro_batch_size_per_gpu")
        ),
        _positive_int("gradient_accumulation_steps", config.get("gradient_accumulation_steps")),
        world_size,
    )
    schedule = _scheduler(config, optimizer["lr"], lost)
    if lost:
        warnings.warn(
            "DeepSpeed config: accepted but ignored (shardwise has no such feature): "
            + "; ".join(lost),
            DeepSpeedConfigWarning,
            stacklevel=3,
        )
    native = {
        "stage": int(zero["stage"]),
        # DeepSpeed's 0 means no bucketing: each gradient is reduced on its own
        "reduce_bucket_numel": max(1, int(float(zero["reduce_bucket_size"]))),
        "allgather_bucket_numel": max(1, int(float(zero["allgather_bucket_size"]))),
        "overlap_comm": bool(zero["overlap_comm"]),
        "offload_optimizer": offload["device"] == "cpu",
        "offload_param": offload_param["device"] == "cpu",
        # the offloaded tensors page-locked (when the parameters are on a GPU): the optimizer's
        # (stages 0-2), or stage 3's offloaded shards (either section, the one that offloads)
        "pin_memory": any(
            s["device"] == "cpu" and bool(s["pin_memory"]) for s in (offload, offload_param)
        ),
        "gradient_clipping": clip,
        # prescale_gradients: divide by the whole data-parallel size before reducing (0 = it)
        "gradient_predivide_factor": 0.0 if config.get("prescale_gradients") else predivide,
        "loss_scaler": _fp16_scaler(fp16),
        "optimizer": optimizer,
    }
    return {
        "train_batch_size": train,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "zero_optimization": {**zero, "offload_optimizer": offload, "offload_param": offload_param},
        "bf16": bf16,
        "fp16": fp16,
        "native": native,
        "schedule": schedule,
        "ignored": lost,
    }
