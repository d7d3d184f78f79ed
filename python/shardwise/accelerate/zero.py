"""``distributed_type: DEEPSPEED`` under shardwise's Accelerator: Accelerate's DeepSpeed path
with shardwise's ZeRO engine where DeepSpeed's would be.

Accelerate's own code still runs: ``_prepare_deepspeed`` fills the config's ``"auto"`` values
(micro batch from the data loader, accumulation, clipping, the bucket sizes from the model's
hidden size), checks the optimizer and scheduler against the config, and wraps what
``deepspeed.initialize`` returns (``DeepSpeedEngineWrapper``, ``DeepSpeedOptimizerWrapper``,
``DeepSpeedSchedulerWrapper``); ``backward``, ``accumulate``, ``clip_grad_norm_``,
``save_state`` / ``load_state`` then take Accelerate's DeepSpeed branches. Only the
``deepspeed`` module that code imports is shardwise's (``DEEPSPEED`` below, around that one
call), whose ``initialize`` builds ``shardwise.zero.ZeroEngine``:

* a torch optimizer passed to ``prepare`` becomes the config's optimizer section and the engine
  follows its learning rate, so Accelerate's scheduler on it keeps working
  (``shardwise.zero.client_optimizer``);
* the plugin is attached without Accelerate's ``HfDeepSpeedConfig`` weak reference, whose
  ZeRO-3 flag makes transformers build models under DeepSpeed's ``zero.Init``: shardwise's
  stage 3 shards a whole model when the engine is built.

DeepSpeed itself need not be installed."""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType, SimpleNamespace

import accelerate
import torch
from accelerate.utils import DeepSpeedPlugin, DistributedType

from .. import deepspeed as shardwise_deepspeed
from ..fsdp import FullyShardedDataParallel
from ..zero.engine import ZeroEngine

# deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES: the scheduler classes Accelerate hands to
# deepspeed.initialize rather than stepping them itself
VALID_LR_SCHEDULES = ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]


class EngineOptimizer:
    """What Accelerate's ``DeepSpeedOptimizerWrapper`` reads of DeepSpeed's optimizer: the
    parameter groups (the client optimizer's, whose ``lr`` the engine follows), ``state`` and
    ``overflow`` (the last boundary's step was skipped, so Accelerate's scheduler does not step)."""

    def __init__(self, engine: ZeroEngine):
        self.engine = engine
        client = engine.client_optimizer
        self.param_groups = client.param_groups if client is not None else []
        self.defaults = client.defaults if client is not None else {}

    @property
    def overflow(self) -> bool:
        return self.engine.overflow

    @property
    def state(self) -> dict:
        return {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing: the engine releases the gradients it steps."""

    def step(self, closure=None) -> None:
        """Nothing: ``accelerator.backward`` steps the engine at the boundary."""


def _initialize(model, config_params, optimizer=None, model_parameters=None, lr_scheduler=None,
                mpu=None):  # fmt: skip
    """``deepspeed.initialize`` as Accelerate calls it (``_prepare_deepspeed``); what shardwise's
    refuses (an ``mpu``, a scheduler callable) is refused there, naming the fix."""
    device = accelerate.PartialState().device
    engine, _, _, scheduler = shardwise_deepspeed.initialize(
        model=model.to(device),
        optimizer=optimizer,
        model_parameters=model_parameters,
        lr_scheduler=lr_scheduler,
        mpu=mpu,
        config_params=config_params,
    )
    return engine, EngineOptimizer(engine), None, scheduler


DEEPSPEED = ModuleType("deepspeed")
DEEPSPEED.__doc__ = "shardwise's deepspeed, as Accelerate's DeepSpeed path imports it"
DEEPSPEED.initialize = _initialize
DEEPSPEED.runtime = SimpleNamespace(
    lr_schedules=SimpleNamespace(VALID_LR_SCHEDULES=VALID_LR_SCHEDULES)
)


@contextlib.contextmanager
def as_deepspeed():
    """``import deepspeed`` gives ``DEEPSPEED`` while Accelerate prepares the objects."""
    previous = sys.modules.get("deepspeed")
    sys.modules["deepspeed"] = DEEPSPEED
    try:
        yield
    finally:
        if previous is None:
            del sys.modules["deepspeed"]
        else:
            sys.modules["deepspeed"] = previous


def plugin_of(given) -> DeepSpeedPlugin:
    """The one DeepSpeed plugin: given (``deepspeed_plugin=``), or from ``accelerate launch``'s
    ``ACCELERATE_DEEPSPEED_*`` variables."""
    if isinstance(given, dict):
        if len(given) != 1:
            raise ValueError(
                "shardwise's Accelerator takes one DeepSpeed plugin, not several; pass one "
                "(deepspeed_plugin=) and build one Accelerator per model"
            )
        given = next(iter(given.values()))
    return given if given is not None else DeepSpeedPlugin()


def attach(accelerator, plugin: DeepSpeedPlugin) -> None:
    """The accelerator's state as Accelerate's would be under DeepSpeed: the plugin selected
    with the precision given to the Accelerator, the kind DEEPSPEED, no native AMP (the engine
    casts)."""
    state = accelerator.state
    plugin.set_mixed_precision(state.mixed_precision)
    plugin._set_selected(True)  # select() without the transformers weak reference (docstring)
    state.deepspeed_plugins = plugin
    state._mixed_precision = "no"  # Accelerate's rule: the DeepSpeed config holds it
    state.distributed_type = DistributedType.DEEPSPEED
    accelerate.state.PartialState._shared_state["distributed_type"] = DistributedType.DEEPSPEED
    accelerator.native_amp = False
    accelerator.deepspeed_engine_wrapped = None


def state_dict(accelerator, engine: ZeroEngine) -> dict:
    """Accelerate's ``get_state_dict`` under DeepSpeed: the model's weights in the engine's
    precision; under stage 3 only with ``stage3_gather_16bit_weights_on_model_save`` (gathered
    from the shards), as Accelerate."""
    if engine.stage == 3:
        zero = accelerator.deepspeed_config["zero_optimization"]
        if not zero.get("stage3_gather_16bit_weights_on_model_save", False):
            raise ValueError(
                "Cannot get 16bit model weights because `stage3_gather_16bit_weights_on_model_save`"
                " in DeepSpeed config is False: set it to True (or `zero3_save_16bit_model` in "
                "`accelerate config`), or save the full checkpoint with save_state"
            )
        fsdp: FullyShardedDataParallel = engine.module
        previous, fsdp.state_dict_type = fsdp.state_dict_type, "full_state_dict"
        try:
            weights = fsdp.state_dict()
        finally:
            fsdp.state_dict_type = previous
        return {
            k: (v.to(engine.dtype) if v.is_floating_point() else v).detach().cpu().clone()
            for k, v in weights.items()
        }
    return {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside the engine (and, under stage 3, its FSDP wrapper)."""
    if isinstance(model, ZeroEngine):
        model = model.module
    if isinstance(model, FullyShardedDataParallel):
        model = model.module
    return model
