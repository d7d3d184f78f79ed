"""DeepSpeed's entry point over shardwise's ZeRO, so a DeepSpeed script changes one import::

    import shardwise.deepspeed as deepspeed
    engine, optimizer, loader, scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), training_data=dataset,
        config="ds_config.json")
    for batch in loader:
        loss = engine(batch); engine.backward(loss); engine.step()

Also DeepSpeed's ``add_config_arguments`` (``--deepspeed``, ``--deepspeed_config``) and
``init_distributed`` (the shardwise backend unless ``dist_backend`` names another); the
``deepspeed --num_gpus N script.py ...`` launch is ``shardwise-deepspeed --num_gpus N script.py
...`` (``deepspeed_launcher.py``).

``initialize`` takes DeepSpeed's arguments and returns its 4-tuple: the engine
(``shardwise.zero.ZeroEngine``), its optimizer (the C++ ZeRO optimizer), a loader over
``training_data`` that behaves as DeepSpeed's (``DeepSpeedDataLoader`` below) or None, and the
scheduler of the config's ``scheduler`` section or None. The optimizer and the scheduler come
from the config: an ``optimizer`` or ``lr_scheduler`` object passed in is refused (shardwise
steps its own fused optimizer), and so are arguments it has no use for that would change
training (``mpu``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..fsdp.config import ConfigError
from ..zero import client_optimizer
from ..zero import config as zero_config
from ..zero.engine import ZeroEngine


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


def _with_client_optimizer(model: nn.Module, optimizer, config) -> dict:
    """The config with the client optimizer as its optimizer section (DeepSpeed refuses nothing
    here, but a config naming another optimizer as well would leave one of them unused)."""
    config = zero_config.read(config)
    if "optimizer" in config:
        raise ConfigError(
            "initialize: an optimizer object and the config's optimizer section were both given; "
            "drop one of them"
        )
    client_optimizer.check_parameters(
        optimizer, {id(p) for p in model.parameters() if p.requires_grad}
    )
    return {**config, "optimizer": client_optimizer.config_section(optimizer)}


def _check_scheduler(optimizer, lr_scheduler, config) -> None:
    """A scheduler object steps the client optimizer's lr, which the engine follows; without a
    client optimizer it would step nothing."""
    if lr_scheduler is None:
        return
    if optimizer is None or not hasattr(lr_scheduler, "step"):
        raise ConfigError(
            "initialize: an lr_scheduler object (or callable) needs the torch optimizer it steps "
            "passed as optimizer=; or describe it in the config's scheduler section"
        )
    if "scheduler" in zero_config.read(config):
        raise ConfigError(
            "initialize: an lr_scheduler object and the config's scheduler section were both "
            "given; drop one of them"
        )


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """DeepSpeed's: adds the "DeepSpeed" argument group (``--deepspeed``, ``--deepspeed_config``
    and the deprecated ``--deepscale``, ``--deepscale_config``); returns the parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument(
        "--deepspeed",
        default=False,
        action="store_true",
        help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)",
    )
    group.add_argument(
        "--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file."
    )
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser


def init_distributed(
    dist_backend: str | None = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int = 29500,
    verbose: bool = True,
    timeout: datetime.timedelta | None = None,
    init_method: str | None = None,
    dist_init_required: bool | None = None,
    config=None,
    rank: int = -1,
    world_size: int = -1,
) -> None:
    """DeepSpeed's ``deepspeed.init_distributed``: starts torch.distributed (the shardwise
    backend unless ``dist_backend`` names one) from a launcher's variables, from ``rank`` and
    ``world_size``, or as one process on ``distributed_port``; nothing when it runs already or
    ``dist_init_required`` is False. No-ops, named in a warning when they would act in
    DeepSpeed: ``auto_mpi_discovery`` (launch with torchrun or ``shardwise-deepspeed``; MPI's
    variables are not read) and ``config`` (DeepSpeed's communication logging); ``verbose``
    only changes DeepSpeed's log lines."""
    ignored = [
        name
        for name, acts in (
            ("auto_mpi_discovery", auto_mpi_discovery and "OMPI_COMM_WORLD_RANK" in os.environ),
            ("config", config is not None),
        )
        if acts
    ]
    if ignored:
        warnings.warn(
            f"init_distributed: {', '.join(ignored)} change nothing under shardwise (no MPI "
            "discovery, no communication logger); launch with torchrun or shardwise-deepspeed",
            stacklevel=2,
        )
    if dist.is_initialized() or dist_init_required is False:
        return
    if rank < 0 and "RANK" not in os.environ:  # one process without a launcher, as DeepSpeed
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
        rank, world_size = 0, 1
    os.environ.setdefault("LOCAL_RANK", "0")
    from .. import distributed  # registers the shardwise backend

    store = distributed.launch_store(timeout) if init_method is None else None
    if store is not None and rank < 0:  # a store needs them given
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        dist_backend or "shardwise",
        init_method=init_method,
        store=store,
        timeout=timeout,
        rank=rank,
        world_size=world_size,
    )


def _init_distributed(dist_init_required: bool | None) -> None:
    if dist.is_initialized() or dist_init_required is False:
        return
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return  # one process without a launcher: no process group is needed
    init_distributed()


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
    if mpu is not None:
        raise ConfigError(
            "initialize: mpu objects are not supported; use tp_group with shardwise.zero.initialize"
        )
    _check_parameters(model, model_parameters)
    config = _config_of(args, config, config_params)
    if optimizer is not None:
        config = _with_client_optimizer(model, optimizer, config)
    _check_scheduler(optimizer, lr_scheduler, config)
    _init_distributed(dist_init_required)
    if args is not None and hasattr(args, "local_rank"):  # DeepSpeed aligns it with LOCAL_RANK
        args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    engine = ZeroEngine(model, config, client_optimizer=optimizer, client_scheduler=lr_scheduler)
    loader = None
    if training_data is not None:
        loader = DeepSpeedDataLoader(
            training_data, engine.config["train_micro_batch_size_per_gpu"], collate_fn
        )
    return engine, engine.optimizer, loader, engine.lr_scheduler


class DeepSpeedDataLoader:
    """DeepSpeed's training loader: a DistributedSampler over the data-parallel ranks (shuffled
    with seed 0, one rank included), ``train_micro_batch_size_per_gpu`` per batch, the last
    short batch kept; ``iter(loader)`` starts the epoch over and returns the loader itself, as
    DeepSpeed's does, so a loop over it after ``next(iter(loader))`` starts from the first
    batch again. ``data_sampler`` is the sampler (``loader.data_sampler.set_epoch(e)``)."""

    def __init__(self, dataset, batch_size: int, collate_fn=None):
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.data_sampler = torch.utils.data.DistributedSampler(
            dataset, num_replicas=world, rank=rank
        )
        self.batch_size = batch_size
        self.dataloader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=self.data_sampler, collate_fn=collate_fn
        )
        self._batches = None

    def __iter__(self):
        self._batches = iter(self.dataloader)
        return self

    def __next__(self):
        if self._batches is None:
            raise TypeError("DeepSpeedDataLoader: call iter(loader) before next()")
        return next(self._batches)

    def __len__(self) -> int:
        return len(self.dataloader)
