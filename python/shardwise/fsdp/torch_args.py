"""torch FSDP's own arguments for ``shardwise.FullyShardedDataParallel``, so a script written for
``torch.distributed.fsdp.FullyShardedDataParallel`` runs with only its import changed (seed
002's example): ``auto_wrap_policy`` (``ModuleWrapPolicy``, or a callable policy such as
``functools.partial(transformer_auto_wrap_policy, ...)`` / ``size_based_auto_wrap_policy``,
evaluated the way torch's ``_recursive_wrap`` evaluates it), ``ShardingStrategy``,
``CPUOffload``, ``BackwardPrefetch`` and ``device_id`` (``MixedPrecision``: ``precision.py``).

Each is translated to shardwise's own argument; what would change training without a
counterpart here (the ZeRO-2 hybrid strategy, ignored modules, ``param_init_fn``) is refused
naming the argument."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .config import ConfigError


def strategy_name(value) -> str:
    """``ShardingStrategy.FULL_SHARD`` (or its name) -> ``full_shard``."""
    if isinstance(value, str):
        return value
    name = getattr(value, "name", None)
    if name in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"):
        return name.lower()
    raise ConfigError(
        f"sharding_strategy {value!r}: shardwise has FULL_SHARD, SHARD_GRAD_OP, NO_SHARD and "
        "HYBRID_SHARD"
    )


def prefetch_name(value) -> str:
    """``BackwardPrefetch.BACKWARD_PRE`` -> ``backward_pre``; None -> ``none``."""
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    name = getattr(value, "name", None)
    if name in ("BACKWARD_PRE", "BACKWARD_POST"):
        return name.lower()
    raise ConfigError(
        f"backward_prefetch {value!r}: use BackwardPrefetch.BACKWARD_PRE/POST or None"
    )


def offload_flag(value) -> bool:
    """``CPUOffload(offload_params=True)`` -> True."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if hasattr(value, "offload_params"):
        return bool(value.offload_params)
    raise ConfigError(f"cpu_offload {value!r}: pass CPUOffload(offload_params=...) or a bool")


def device_of(device_id) -> torch.device | None:
    """torch FSDP's ``device_id``: an int is a CUDA device index."""
    if device_id is None:
        return None
    if isinstance(device_id, int):
        return torch.device("cuda", device_id)
    return torch.device(device_id)


def wrap_names(root: nn.Module, policy) -> list[str]:
    """The submodules ``policy`` wraps, children first (root excluded: it is the root unit)."""
    if policy is None:
        return []
    classes = getattr(policy, "_module_classes", None)
    if classes is not None:  # ModuleWrapPolicy
        found = [n for n, m in root.named_modules() if n and isinstance(m, tuple(classes))]
        return _children_first(found)
    if not callable(policy):
        raise ConfigError(
            f"auto_wrap_policy {policy!r}: pass ModuleWrapPolicy(...) or a callable policy "
            "(module, recurse, nonwrapped_numel) such as functools.partial("
            "transformer_auto_wrap_policy, transformer_layer_cls={...})"
        )
    names: list[str] = []
    _recursive(root, "", policy, names)
    return names


def _recursive(module: nn.Module, name: str, policy: Callable, names: list[str]) -> int:
    """torch's _recursive_wrap without the wrapping: returns the numel wrapped below and at
    ``module``; appends wrapped names in post-order (children first)."""
    total = sum(p.numel() for p in module.parameters())
    if not policy(module=module, recurse=True, nonwrapped_numel=total):
        return 0
    wrapped = 0
    for child_name, child in module.named_children():
        wrapped += _recursive(child, f"{name}.{child_name}" if name else child_name, policy, names)
    if name and policy(module=module, recurse=False, nonwrapped_numel=total - wrapped):
        names.append(name)
        return total
    return wrapped


def _children_first(names: list[str]) -> list[str]:
    return sorted(names, key=lambda n: -n.count("."))
