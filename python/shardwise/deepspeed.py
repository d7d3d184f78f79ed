"""DeepSpeed's entry point over shardwise's ZeRO, so a DeepSpeed script changes one import::

    import shardwise.deepspeed as deepspeed
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=dataset,
        config="ds_config.json")
    for batch in loader:
        loss = engine(batch); engine.backward(loss); engine.step()

``initialize`` takes DeepSpeed's arguments and returns its 4-tuple: the engine
(``shardwise.zero.ZeroEngine``), its optimizer (the C++ ZeRO optimizer), a DataLoader over
``training_data`` (``train_micro_batch_size_per_gpu`` per rank, a DistributedSampler over the
data-parallel ranks, as DeepSpeed builds) or None, and the scheduler of the config's
``scheduler`` section or None. The optimizer and the scheduler come from the config: an
``optimizer`` or ``lr_scheduler`` object passed in is refused (shardwise steps its own fused
optimizer), and so are arguments it has no use for that would change training (``mpu``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .fsdp.config import ConfigError
from .zero.engine import ZeroEngine


def _config_of(args, config, config_params):
    if config is not None and config_params is not None:
        raise ConfigError("initialize: pass config or config_params, not both")
    config = config if config is not None else config_params
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if config is None:
        raise ConfigError(
            "initialize: no DeepSpeed config; pass config= (a dict or a ds_config.json path) or "
            "args with --deepspeed_config"
        )
    return config


def _check_parameters(model: nn.Module, model_parameters) -> None:
    """DeepSpeed builds its optimizer over model_parameters; shardwise over the model's trainable
    parameters, so anything else would silently train a different set."""
    if model_parameters is None:
        return
    given = list(model_parameters)
    if given and isinstance(given[0], Mapping):  # parameter groups
        given = [p for group in given for p in group["params"]]
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    if {id(p) for p in given} != trainable:
        raise ConfigError(
            "initialize: model_parameters must be the model's trainable parameters "
            "(shardwise's ZeRO steps all of them); freeze the others with requires_grad_(False)"
        )


def _init_distributed(dist_init_required: bool | None) -> None:
    if dist.is_initialized() or dist_init_required is False:
        return
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return  # one process, as DeepSpeed runs without a launcher
    import shardwise  # noqa: F401  (registers the backend)

    dist.init_process_group("shardwise")


def initialize(
    args=None,
    model: nn.Module | None = None,
    optimizer=None,
    model_parameters: Iterable | None = None,
    training_data=None,
    lr_scheduler=None,
    mpu=None,
    dist_init_required: bool | None = None,
    collate_fn=None,
    config: Mapping | str | Path | None = None,
    config_params: Mapping | None = None,
):
    """DeepSpeed's ``deepspeed.initialize``: (engine, optimizer, training dataloader or None,
    lr scheduler or None)."""
    if model is None:
        raise ConfigError("initialize: model is required")
    for name, value, why in (
        ("optimizer", optimizer, "describe it in the config's optimizer section"),
        ("lr_scheduler", lr_scheduler, "describe it in the config's scheduler section"),
        ("mpu", mpu, "use tp_group with shardwise.zero.initialize"),
    ):
        if value is not None:
            raise ConfigError(f"initialize: {name} objects are not supported; {why}")
    _check_parameters(model, model_parameters)
    _init_distributed(dist_init_required)
    engine = ZeroEngine(model, _config_of(args, config, config_params))
    loader = None
    if training_data is not None:
        sampler = None
        if dist.is_initialized() and dist.get_world_size() > 1:
            sampler = torch.utils.data.DistributedSampler(training_data)
        loader = torch.utils.data.DataLoader(
            training_data,
            batch_size=engine.config["train_micro_batch_size_per_gpu"],
            sampler=sampler,
            collate_fn=collate_fn,
        )
    return engine, engine.optimizer, loader, engine.lr_scheduler
