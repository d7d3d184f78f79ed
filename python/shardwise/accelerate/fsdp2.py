"""``fsdp_version: 2`` under shardwise's Accelerator: Accelerate's FSDP2 path with
``shardwise.fully_shard`` where torch's ``fully_shard`` would be.

Accelerate's ``_prepare_fsdp2`` still runs: the loaders and schedulers are prepared, activation
checkpointing is applied to the auto-wrap policy's modules, the optimizer is moved onto the
sharded parameters by name. Only its ``fsdp2_prepare_model`` is replaced (``as_fsdp2``, around
that one call) by ``prepare_model`` below, which shards as Accelerate's does, in its order:

* every module the auto-wrap policy (``fsdp_transformer_layer_cls_to_wrap`` or a size) names,
  bottom-up; then the input embedding (untied), then the final norm with the output embedding
  (and the input one when tied) as one unit that keeps its parameters after forward; then the
  root, with FSDP2's default resharding;
* with the plugin's ``reshard_after_forward``, ``mp_policy`` (the mixed precision given to the
  Accelerator) and ``offload_policy``; trainable parameters upcast to fp32 under mixed
  precision, as Accelerate's;
* ``cpu_ram_efficient_loading``: rank 0's weights are broadcast before sharding (Accelerate
  loads them on rank 0 and distributes them after).

shardwise's ``fully_shard`` shards the parameters in place (they are not DTensors), so the
model's state, its gradient clipping and the optimizer's state go through the model
(``FSDPModule.state_dict``, ``clip_grad_norm_``, ``shardwise.fsdp.optim_state``): the
Accelerator routes them there (``__init__.py``)."""

from __future__ import annotations

import contextlib

import accelerate.accelerator
import torch
import torch.distributed as dist
from accelerate.utils import DynamoBackend
from accelerate.utils.fsdp_utils import _find_final_norm, fsdp2_prepare_auto_wrap_policy
from accelerate.utils.other import get_module_children_bottom_up
from torch.distributed.fsdp import MixedPrecisionPolicy

from ..fsdp.fsdp2 import FSDPModule, fully_shard
from ..fsdp.module import broadcast_from_rank0


def _check(accelerator, model: torch.nn.Module) -> None:
    plugin = accelerator.state.fsdp_plugin
    if plugin.ignored_modules is not None:
        raise ValueError(
            "fsdp_config's ignored_modules is not supported by shardwise's FSDP; drop it "
            "(every parameter is sharded) or freeze those modules' parameters instead"
        )
    if accelerator.state.dynamo_plugin.backend != DynamoBackend.NO:
        raise ValueError(
            "torch.compile (dynamo_backend) with fsdp_version: 2 is not supported by shardwise's "
            "fully_shard; set dynamo_backend: NO"
        )
    meta = [n for n, p in model.named_parameters() if p.is_meta]
    if meta:
        raise ValueError(
            f"fsdp_version 2: {meta[0]} is on the meta device; shardwise shards real weights: "
            "build or load the model on every rank (cpu_ram_efficient_loading then broadcasts "
            "rank 0's)"
        )


def prepare_model(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """Accelerate's ``fsdp2_prepare_model`` over ``shardwise.fully_shard`` (module docstring)."""
    if isinstance(model, FSDPModule):
        return model
    _check(accelerator, model)
    plugin = accelerator.state.fsdp_plugin
    plugin.set_auto_wrap_policy(model)
    if plugin.cpu_ram_efficient_loading:
        broadcast_from_rank0(model, dist.group.WORLD)
    mesh = getattr(accelerator, "torch_device_mesh", None)
    kwargs = {
        "reshard_after_forward": plugin.reshard_after_forward,
        "offload_policy": plugin.cpu_offload,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
        "mesh": mesh[tuple(accelerator.parallelism_config.fsdp_dim_names)] if mesh else None,
    }
    if accelerator.mixed_precision != "no":  # fp32 master weights; mp_policy casts
        for param in model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.to(torch.float32)
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    if policy is not None:
        for module in get_module_children_bottom_up(model)[:-1]:
            if policy(module) and not isinstance(module, FSDPModule):
                fully_shard(module, **kwargs)
    _shard_embeddings(model, kwargs)
    root = {k: v for k, v in kwargs.items() if k != "reshard_after_forward"}
    return fully_shard(model, **root)


def _shard_embeddings(model: torch.nn.Module, kwargs: dict) -> None:
    """The input embedding as a unit of its own (untied), and the tail (final norm, output
    embedding, the input one when tied) as one that keeps its parameters after forward."""
    input_embed = getattr(model, "get_input_embeddings", lambda: None)()
    output_embed = getattr(model, "get_output_embeddings", lambda: None)()
    input_weight = getattr(input_embed, "weight", None)
    tied = input_weight is not None and input_weight is getattr(output_embed, "weight", None)
    if not tied and input_embed is not None and not isinstance(input_embed, FSDPModule):
        fully_shard(input_embed, **kwargs)
    final_norm = _find_final_norm(model)
    tail = (final_norm, input_embed, output_embed) if tied else (final_norm, output_embed)
    tail = [m for m in tail if m is not None and not isinstance(m, FSDPModule)]
    if tail:
        fully_shard(tail, **{**kwargs, "reshard_after_forward": False})


@contextlib.contextmanager
def as_fsdp2():
    """Accelerate's ``_prepare_fsdp2`` calls ``prepare_model`` while it prepares the objects."""
    previous = accelerate.accelerator.fsdp2_prepare_model
    accelerate.accelerator.fsdp2_prepare_model = prepare_model
    try:
        yield
    finally:
        accelerate.accelerator.fsdp2_prepare_model = previous
