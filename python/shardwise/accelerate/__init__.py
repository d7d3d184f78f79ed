"""Hugging Face Accelerate scripts on shardwise, with one line changed::

    from shardwise.accelerate import Accelerator      # was: from accelerate import Accelerator

``Accelerator`` is Accelerate's own class: the data loaders' sharding and RNG synchronization,
``accumulate``, ``backward``, ``gather``, the optimizer and scheduler wrappers, ``save_state`` /
``load_state`` and ``save_model`` run Accelerate's code, so they behave as Accelerate's. What
changes:

* **The process group** is shardwise's backend (``shardwise`` on CPU, ``cpu:shardwise,
  cuda:nccl`` on GPUs), started from the launcher's environment (torchrun, ``accelerate
  launch``) before Accelerate would start its own.
* **No GPU**: the processes train on the CPU (Accelerate's ``cpu=True``), so a config written
  for GPUs (``distributed_type: FSDP``, ``accelerate launch``) runs on a machine without one.
* **FSDP** (``distributed_type: FSDP`` in Accelerate's config YAML, which ``accelerate launch``
  passes as ``ACCELERATE_USE_FSDP`` and ``FSDP_*``, or ``fsdp_plugin=``) wraps the model with
  shardwise's ``FullyShardedDataParallel``, built from Accelerate's FSDP plugin with the
  arguments Accelerate gives torch's (sharding strategy, auto-wrap policy, mixed precision,
  prefetching, CPU offload, module-state sync, activation checkpointing, state-dict type).
  ``clip_grad_norm_`` and ``no_sync`` are the wrapper's; the model's state (``get_state_dict``,
  ``save_model``, ``save_state``) is the full state dict gathered from the shards, and
  ``load_state`` loads one back into them.

* **DeepSpeed** (``distributed_type: DEEPSPEED`` with a ``deepspeed_config``, or
  ``deepspeed_plugin=``) runs Accelerate's DeepSpeed path with shardwise's ZeRO engine where
  DeepSpeed's would be (``zero.py``): stages 0-3, the config's precision, accumulation and
  clipping, the script's torch optimizer and scheduler; DeepSpeed need not be installed.

* **FSDP2** (``fsdp_version: 2``) runs Accelerate's FSDP2 path with ``shardwise.fully_shard``
  (``fsdp2.py``); the gradient norm, the model's state and the optimizer's go through the
  sharded model.

Refused with the fix, before any work: FSDP's ``ignored_modules``, torch.compile under FSDP2,
several DeepSpeed plugins.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from types import MethodType

import torch

try:
    import accelerate
except ImportError as error:
    raise ImportError(
        "shardwise.accelerate is Hugging Face Accelerate's Accelerator over shardwise: install "
        "it (pip install accelerate, or shardwise[accelerate])"
    ) from error
import torch.distributed as dist
from accelerate.utils import (
    DistributedType,
    FullyShardedDataParallelPlugin,
    convert_outputs_to_fp32,
    str_to_bool,
)
from accelerate.utils.modeling import get_mixed_precision_context_manager

from ..fsdp import FullyShardedDataParallel, optim_state
from ..fsdp.fsdp2 import FSDPModule
from ..zero.engine import ZeroEngine
from . import fsdp2, zero

__all__ = ["Accelerator"]

SYNC_KEYS = ("FSDP_SYNC_MODULE_STATES", "FSDP_CPU_RAM_EFFICIENT_LOADING")
# Accelerate's FSDP plugin's state-dict types, as shardwise's wrapper names them
STATE_DICT_TYPES = {
    "FULL_STATE_DICT": "full_state_dict",
    "SHARDED_STATE_DICT": "sharded_state_dict",
    "LOCAL_STATE_DICT": "local_state_dict",
}


def _start_process_group() -> None:
    """The shardwise process group from the launcher's environment (nothing for one process)."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    from ..train.device import default_backend

    gpus = torch.cuda.device_count()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    backend = default_backend("cuda" if gpus else "cpu", gpus, per_node)
    if gpus:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % gpus)
    from .. import distributed

    distributed.init_process_group(backend)


def _plugin_from_env() -> FullyShardedDataParallelPlugin:
    """Accelerate's FSDP plugin from ``accelerate launch``'s ``FSDP_*`` variables. Its
    ``sync_module_states`` (which ``cpu_ram_efficient_loading`` implies) asks for a GPU, to
    build a meta-device model there; shardwise's wrapper broadcasts rank 0's states itself, so
    those two keys are read after the plugin is built, with Accelerate's rule between them."""
    held = {k: os.environ.pop(k, None) for k in SYNC_KEYS}
    try:
        plugin = FullyShardedDataParallelPlugin()
    finally:
        os.environ.update({k: v for k, v in held.items() if v is not None})
    efficient = str_to_bool(held["FSDP_CPU_RAM_EFFICIENT_LOADING"] or "false") == 1
    plugin.cpu_ram_efficient_loading = efficient
    plugin.sync_module_states = (
        efficient or str_to_bool(held["FSDP_SYNC_MODULE_STATES"] or "false") == 1
    )
    return plugin


class Accelerator(accelerate.Accelerator):
    """Accelerate's ``Accelerator`` over shardwise (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        wants_fsdp = (
            os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
            or kwargs.get("fsdp_plugin") is not None
        )
        zero_plugin = kwargs.pop("deepspeed_plugin", None) or kwargs.pop("deepspeed_plugins", None)
        wants_zero = (
            os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
            or zero_plugin is not None
        )
        _start_process_group()
        if not torch.cuda.is_available():
            kwargs["cpu"] = True  # CPU processes: Accelerate would otherwise run one
        plugin = kwargs.pop("fsdp_plugin", None)
        if wants_zero:
            # Accelerate's DeepSpeed needs DeepSpeed and a GPU; the plugin is attached here
            held = os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
            try:
                super().__init__(*args, fsdp_plugin=plugin, **kwargs)
            finally:
                if held is not None:
                    os.environ["ACCELERATE_USE_DEEPSPEED"] = held
            zero.attach(self, zero.plugin_of(zero_plugin))
        elif wants_fsdp and kwargs.get("cpu"):
            # Accelerate selects FSDP on GPUs only; on the CPU the plugin is taken here
            os.environ.pop("ACCELERATE_USE_FSDP", None)
            super().__init__(*args, **kwargs)
            os.environ["ACCELERATE_USE_FSDP"] = "true"
            plugin = plugin or _plugin_from_env()
            if self.state.distributed_type == DistributedType.MULTI_CPU:
                if self.state.mixed_precision != "no":
                    plugin.set_mixed_precision(self.state.mixed_precision)
                _set_distributed_type(self.state, DistributedType.FSDP)
                self.state.fsdp_plugin = plugin
        else:
            super().__init__(*args, fsdp_plugin=plugin, **kwargs)

    # --- the model ---------------------------------------------------------------------

    def prepare_model(self, model, device_placement=None, evaluation_mode=False):
        """Accelerate's, except that FSDP is shardwise's wrapper (see the module docstring)."""
        if self.distributed_type != DistributedType.FSDP or evaluation_mode:
            return super().prepare_model(model, device_placement, evaluation_mode)
        if getattr(model, "_is_accelerate_prepared", False):
            return model
        if self.native_amp:  # Accelerate's autocast around the forward, outputs back in fp32
            autocast = get_mixed_precision_context_manager(self.native_amp, self.autocast_handler)
            model._original_forward = model.forward
            forward = autocast(model.forward.__func__)
            model.forward = MethodType(convert_outputs_to_fp32(forward), model)
        plugin = self.state.fsdp_plugin
        if plugin.ignored_modules is not None:
            raise ValueError(
                "fsdp_config's ignored_modules is not supported by shardwise's FSDP; drop it "
                "(every parameter is sharded) or freeze those modules' parameters instead"
            )
        plugin.set_auto_wrap_policy(model)
        state_dict_type = STATE_DICT_TYPES[getattr(plugin.state_dict_type, "name", None)]
        if state_dict_type != "full_state_dict":
            warnings.warn(
                f"fsdp_state_dict_type {state_dict_type}: the model's state_dict() gives it, but "
                "save_state, save_model and get_state_dict write the full state dict (shardwise "
                "gathers the shards for Accelerate's files)",
                stacklevel=2,
            )
        wrapped = FullyShardedDataParallel(
            model.to(self.device),
            sharding_strategy=plugin.sharding_strategy or plugin.reshard_after_forward,
            cpu_offload=plugin.cpu_offload,
            auto_wrap_policy=plugin.auto_wrap_policy,
            mixed_precision=plugin.mixed_precision_policy,
            sync_module_states=plugin.sync_module_states,
            backward_prefetch=plugin.backward_prefetch,
            forward_prefetch=plugin.forward_prefetch,
            use_orig_params=plugin.use_orig_params,
            limit_all_gathers=plugin.limit_all_gathers,
            activation_checkpointing=plugin.activation_checkpointing,
            state_dict_type=state_dict_type,
        )
        wrapped._is_accelerate_prepared = True
        self._models.append(wrapped)
        return wrapped

    def _prepare_fsdp2(self, *args):
        """Accelerate's, with ``shardwise.fully_shard`` as its ``fully_shard`` (``fsdp2.py``)."""
        with fsdp2.as_fsdp2():
            return super()._prepare_fsdp2(*args)

    def _clip_grad_norm_dtensor_aware(self, parameters, max_norm, norm_type=2):
        """Under FSDP2: the norm across the shards, from the model that holds them."""
        for model in self._models:
            if isinstance(model, FSDPModule) and parameters == list(model.parameters()):
                return model.clip_grad_norm_(max_norm, norm_type)
        return super()._clip_grad_norm_dtensor_aware(parameters, max_norm, norm_type=norm_type)

    def _prepare_deepspeed(self, *args):
        """Accelerate's, with shardwise's ZeRO as its ``deepspeed`` (``zero.py``)."""
        with zero.as_deepspeed():
            return super()._prepare_deepspeed(*args)

    def unwrap_model(self, model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True):
        model = zero.unwrap(model)
        if isinstance(model, FullyShardedDataParallel):
            model = model.module
        return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

    def get_state_dict(self, model, unwrap=True):
        """The full state dict (under FSDP: gathered from the shards, on every rank)."""
        if isinstance(model, ZeroEngine):
            return zero.state_dict(self, model)
        if isinstance(model, FSDPModule):  # state_dict() gathers the full tensors
            return {k: v.detach().cpu() for k, v in model.state_dict().items()}
        if isinstance(model, FullyShardedDataParallel):
            with _full_state_dict(model):
                return {k: v.detach().cpu() for k, v in model.state_dict().items()}
        return super().get_state_dict(model, unwrap)

    def save_state(self, output_dir=None, safe_serialization=True, **kwargs):
        """Accelerate's layout (model.safetensors, optimizer.bin, scheduler.bin, the sampler,
        the RNG states); under FSDP the model file holds the full state dict."""
        with self._fsdp_as_data_parallel():
            return super().save_state(output_dir, safe_serialization, **kwargs)

    def load_state(self, input_dir=None, load_kwargs=None, **kwargs):
        with self._fsdp_as_data_parallel():
            return super().load_state(input_dir, load_kwargs, **kwargs)

    @contextlib.contextmanager
    def _fsdp_as_data_parallel(self):
        """Accelerate's state saving for a model whose state dict is whole: its data-parallel
        path (torch FSDP's own calls do not apply to shardwise's wrapper)."""
        if self.distributed_type != DistributedType.FSDP:
            yield
            return
        sharded = [m for m in self._models if isinstance(m, FullyShardedDataParallel | FSDPModule)]
        _set_distributed_type(self.state, DistributedType.MULTI_CPU)
        try:
            with contextlib.ExitStack() as stack:
                for model in sharded:
                    if isinstance(model, FullyShardedDataParallel):  # FSDPModule's is full
                        stack.enter_context(_full_state_dict(model))
                for optimizer in self._optimizers:
                    stack.enter_context(_full_optimizer_state(sharded, optimizer.optimizer))
                yield
        finally:
            _set_distributed_type(self.state, DistributedType.FSDP)


def _set_distributed_type(state, kind: DistributedType) -> None:
    """Accelerate's state and its process state agree on the kind (Accelerate copies the
    latter into the former whenever an object asks for the state)."""
    state.distributed_type = kind
    accelerate.state.PartialState._shared_state["distributed_type"] = kind


@contextlib.contextmanager
def _full_state_dict(model: FullyShardedDataParallel):
    previous, model.state_dict_type = model.state_dict_type, "full_state_dict"
    try:
        yield
    finally:
        model.state_dict_type = previous


@contextlib.contextmanager
def _full_optimizer_state(models: list, optimizer: torch.optim.Optimizer):
    """The optimizer's ``state_dict`` / ``load_state_dict`` whole (torch FSDP's
    ``optim_state_dict`` and ``optim_state_dict_to_load``) for the model whose shards it steps:
    what Accelerate writes from rank 0 and reads on every rank."""
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    owner = next((m for m in models if ids & {id(p) for p in m.parameters()}), None)
    if owner is None:
        yield
        return
    optimizer.state_dict = lambda: optim_state.full_optim_state_dict(owner, optimizer)
    optimizer.load_state_dict = lambda state: optim_state.load_full_optim_state_dict(
        owner, optimizer, state
    )
    try:
        yield
    finally:
        del optimizer.state_dict, optimizer.load_state_dict
