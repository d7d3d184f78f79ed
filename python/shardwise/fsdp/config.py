"""The FSDP section of a config: the FSDP config keys under ``distributed:``, verbatim,
Hugging Face Accelerate's ``fsdp_config`` keys (``FULL_SHARD``, ``TRANSFORMER_BASED_WRAP``,
``fsdp_transformer_layer_cls_to_wrap``, ``fsdp_offload_params``, ...), plus the few extras a
production run needs. Unknown keys and values are errors that list the
valid ones (and suggest the closest key)."""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import torch

from .. import _C
from ..mesh import mesh_spec

STRATEGIES = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard")
BACKWARD_PREFETCH = ("backward_pre", "backward_post", "none")
AUTO_WRAP = ("transformer_auto_wrap", "size_based_auto_wrap", "none")
STATE_DICT_TYPES = ("full_state_dict", "local_state_dict", "sharded_state_dict")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}

# Keys of the same ``distributed:`` section that belong to other parts of a run (process
# launch, pipeline, ZeRO); accepted here and left to them.
OTHER_DISTRIBUTED_KEYS = frozenset(
    {
        "backend",
        "num_nodes",
        "num_processes_per_node",
        "world_size",
        "rank",
        "local_rank",
        "master_addr",
        "master_port",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "use_zero",
        "zero_stage",
        "pipeline_schedule",
        "num_microbatches",
    }
)


class ConfigError(ValueError):
    """A config key or value that is not valid; the message lists the valid ones."""


# Hugging Face Accelerate's fsdp_config keys and values (``accelerate config``'s YAML), read as
# the FSDP config key they mean. Values are matched case-insensitively.
ACCELERATE_VALUES = {
    "transformer_based_wrap": "transformer_auto_wrap",
    "size_based_wrap": "size_based_auto_wrap",
    "no_wrap": "none",
    "no_prefetch": "none",
}
ACCELERATE_KEYS = {
    "fsdp_offload_params": "fsdp_cpu_offload",
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls",
    "fsdp_backward_prefetch_policy": "fsdp_backward_prefetch",
    "fsdp_sync_module_states": "sync_module_states",
    "fsdp_activation_checkpointing": "gradient_checkpointing",
}
# Accelerate keys with nothing to choose here (parameters always stay the original tensors and
# are built before wrapping; one FSDP generation).
ACCELERATE_ACCEPTED = frozenset(
    {"fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading", "fsdp_version"}
)


def _warn_accelerate_choices(config: Mapping) -> None:
    """``ACCELERATE_ACCEPTED`` keys whose value asks for something else than what runs."""
    unmet = {
        "fsdp_use_orig_params": (
            False,
            "parameters are always the original tensors, as with true",
        ),
        "fsdp_cpu_ram_efficient_loading": (
            True,
            "every rank builds the model; fsdp_sync_module_states broadcasts rank 0's",
        ),
        "fsdp_version": (2, "one engine reads FSDP1's and FSDP2's keys alike"),
    }
    named = [
        f"{key}={config[key]!r} ({why})"
        for key, (asks, why) in unmet.items()
        if key in config and str(config[key]).lower() == str(asks).lower()
    ]
    if named:
        warnings.warn(
            "Accelerate fsdp_config: accepted but ignored: " + "; ".join(named), stacklevel=4
        )


def _from_accelerate(config: Mapping) -> dict:
    """``config`` with Accelerate's keys and upper-case values in the FSDP config keys' form;
    the Accelerate keys with nothing to choose here are named in one warning when a value asks
    for what does not run."""
    out: dict = {}
    _warn_accelerate_choices(config)
    for key, value in config.items():
        if key in ACCELERATE_ACCEPTED:
            continue
        if key == "fsdp_reshard_after_forward":  # FSDP2's spelling of the strategy
            key, value = "fsdp_sharding_strategy", "full_shard" if value else "shard_grad_op"
        key = ACCELERATE_KEYS.get(key, key)
        if (
            key == "fsdp_sharding_strategy"
            and isinstance(value, int)
            and not isinstance(value, bool)
        ):
            value = dict(enumerate(STRATEGIES, start=1)).get(value, value)  # Accelerate's 1-4
        if isinstance(value, str) and key != "fsdp_transformer_layer_cls":
            value = ACCELERATE_VALUES.get(
                value.lower(), value.lower() if value.isupper() else value
            )
        if key == "fsdp_transformer_layer_cls" and isinstance(value, str) and "," in value:
            value = [part.strip() for part in value.split(",") if part.strip()]
        if key in out and out[key] != value:
            raise ConfigError(
                f"{key} is given twice with different values: {out[key]!r} and {value!r}"
            )
        out[key] = value
    return out


@dataclass(frozen=True)
class FSDPConfig:
    use_fsdp: bool = True
    fsdp_sharding_strategy: str = "full_shard"
    fsdp_backward_prefetch: str = "backward_pre"
    fsdp_forward_prefetch: bool = False
    fsdp_auto_wrap_policy: str = "transformer_auto_wrap"
    fsdp_min_num_params: int = 100_000_000
    fsdp_transformer_layer_cls: tuple[str, ...] = ()  # class names; empty: ModuleList children
    fsdp_state_dict_type: str = "full_state_dict"
    fsdp_mixed_precision: bool = False
    fsdp_param_dtype: str = "bfloat16"
    fsdp_reduce_dtype: str = "float32"
    fsdp_buffer_dtype: str = "float32"
    fsdp_cpu_offload: bool = False
    gradient_checkpointing: bool = False
    sync_module_states: bool = False
    # hybrid_shard: [[replicas, shards], ["dp", "fsdp"]] (the mesh_shape form); default: shard
    # within a host (LOCAL_WORLD_SIZE), replicate across hosts.
    mesh_shape: tuple | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_mapping(cls, config: Mapping) -> FSDPConfig:
        """Validates a ``distributed:`` mapping and returns the FSDP part of it."""
        if not isinstance(config, Mapping):
            raise ConfigError(f"the FSDP config must be a mapping, got {type(config).__name__}")
        known = {f.name for f in fields(cls)} - {"extra"}
        values, extra = {}, {}
        for key, value in _from_accelerate(config).items():
            if key in known:
                values[key] = value
            elif key in OTHER_DISTRIBUTED_KEYS:
                extra[key] = value
            else:
                names = known | OTHER_DISTRIBUTED_KEYS | set(ACCELERATE_KEYS) | ACCELERATE_ACCEPTED
                close = difflib.get_close_matches(key, sorted(names), 1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"unknown key {key!r} in the distributed config{hint}; valid FSDP keys: "
                    f"{', '.join(sorted(known))}"
                )
        if "fsdp_transformer_layer_cls" in values:
            layer_cls = values["fsdp_transformer_layer_cls"]
            values["fsdp_transformer_layer_cls"] = (
                (layer_cls,) if isinstance(layer_cls, str) else tuple(layer_cls)
            )
        if values.get("mesh_shape") is not None:
            values["mesh_shape"] = tuple(tuple(axis) for axis in values["mesh_shape"])
        result = cls(**values, extra=extra)
        result.validate()
        return result

    def validate(self) -> None:
        _choice("fsdp_sharding_strategy", self.fsdp_sharding_strategy, STRATEGIES)
        _choice(
            "fsdp_backward_prefetch", str(self.fsdp_backward_prefetch).lower(), BACKWARD_PREFETCH
        )
        _choice("fsdp_auto_wrap_policy", str(self.fsdp_auto_wrap_policy).lower(), AUTO_WRAP)
        _choice("fsdp_state_dict_type", self.fsdp_state_dict_type, STATE_DICT_TYPES)
        for key in ("fsdp_param_dtype", "fsdp_reduce_dtype", "fsdp_buffer_dtype"):
            dtype_of(key, getattr(self, key))
        for key in (
            "use_fsdp",
            "fsdp_forward_prefetch",
            "fsdp_mixed_precision",
            "fsdp_cpu_offload",
            "gradient_checkpointing",
            "sync_module_states",
        ):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if not isinstance(self.fsdp_min_num_params, int) or self.fsdp_min_num_params < 0:
            value = self.fsdp_min_num_params
            raise ConfigError(f"fsdp_min_num_params must be a non-negative integer, got {value!r}")
        if self.mesh_shape is not None:
            mesh_axes(self.mesh_shape)


def _choice(key: str, value, valid) -> None:
    if value not in valid:
        raise ConfigError(f"{key}: {value!r} is not valid; valid values: {', '.join(valid)}")


def dtype_of(key: str, name) -> torch.dtype:
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    text = DTYPE_ALIASES.get(str(name), str(name))
    if text not in DTYPES:
        raise ConfigError(f"{key}: {name!r} is not valid; valid values: {', '.join(DTYPES)}")
    return DTYPES[text]


def mesh_axes(mesh_shape) -> tuple[int, int]:
    """(replicas, shards) of a hybrid mesh such as [[2, 2], ["dp", "fsdp"]] (torch's HSDP names
    ``replicate`` and ``shard`` work too): the value read by ``shardwise.mesh.mesh_spec``, the
    axes resolved by the C++ layout, which FSDP then asks for its two data axes."""
    try:
        key, sizes, names = mesh_spec(mesh_shape)
        # the world is the mesh's (at least 1, so a size < 1 is named as such by the layout)
        layout = _C.ParallelLayout(max(1, math.prod(sizes)), [(key, sizes, names)])
    except ValueError as error:
        raise ConfigError(str(error)) from None
    for axis in ("tp", "pp"):
        if layout.axis_size(axis) != 1:
            raise ConfigError(
                f"mesh_shape {mesh_shape!r}: axis {axis!r} of size {layout.axis_size(axis)}; "
                "FSDP shards and replicates over the data axes only (dp/replicate, fsdp/shard): "
                "give other axes size 1, or use shardwise-train for tensor or pipeline parallelism"
            )
    return layout.axis_size("dp"), layout.axis_size("fsdp")
