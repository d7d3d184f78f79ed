"""``shardwise.FullyShardedDataParallel``: the nn.Module face of the C++ FSDP engine.

This file only adapts: it picks the units (auto-wrap), creates the process groups of the
strategy, registers module hooks that call the engine (``csrc/fsdp/fsdp_engine.h``) and maps
state dicts to parameter names. Sharding, collectives, prefetch, gradient reduction and clipping
all happen in C++.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn
from torch.distributed.fsdp import MixedPrecision
from torch.utils.checkpoint import checkpoint

from .. import _C
from . import auto_wrap, precision, torch_args
from .config import ConfigError, FSDPConfig, dtype_of, mesh_axes

ROOT = "<root>"


class OwnedSlice(NamedTuple):
    """What this rank holds of one parameter: elements ``[start, start + valid)`` of its
    flattened original of ``numel`` elements (the flat layout's rule, computed by the C++ unit;
    a rank holding none of it has ``valid`` 0 and ``start`` ``numel``). ``parameter`` is the
    sharded parameter, whose data is exactly that slice; ``name`` its name in the wrapped module
    (the first, for a tied parameter)."""

    name: str
    parameter: nn.Parameter
    start: int
    valid: int
    numel: int


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


class FullyShardedDataParallel(nn.Module):
    """Shards ``module``'s parameters over the data-parallel ranks (see docs/fsdp.md).

    Args:
        module: the model; every rank must build it identically (or pass sync_module_states).
        sharding_strategy: full_shard, shard_grad_op, no_shard or hybrid_shard.
        param_dtype / reduce_dtype / buffer_dtype: mixed precision (None: keep the parameters').
        wrap: names of submodules that become units (children first); the rest is the root unit.
        backward_prefetch: backward_pre, backward_post or none. forward_prefetch: bool.
        cpu_offload: keep shards and gradient shards in CPU memory; ``pin_memory`` (default
            True, as torch's FSDP pins them) page-locks them when the parameters are on a GPU.
        activation_checkpointing: recompute each unit's activations in backward.
        sync_module_states: broadcast parameters and buffers from rank 0 first.
        state_dict_type: full_state_dict, sharded_state_dict or local_state_dict.
        process_group: the data-parallel ranks (default: the world).
        mesh: (replicas, shards) for hybrid_shard (default: shard within the host).
        post_forward_shard_size: after forward, each resharding unit keeps its parameters
            sharded over groups of this many consecutive ranks of its shard group instead of
            all of them, and backward all-gathers within the group (FSDP2's int
            ``reshard_after_forward``; DeepSpeed ZeRO++'s ``zero_hpz_partition_size``): a
            factor of the shard group's size, such as the ranks per host. None: all of them.
        quantized_all_gather: all-gather the parameters as int8 in blocks of 2048 with an fp32
            scale each (DeepSpeed ZeRO++'s ``zero_quantized_weights``, qwZ): about a quarter of
            fp32's bytes; compute sees each value within half its block's max / 127, while the
            shards, the optimizer and state dicts keep full precision.
        quantized_reduce_scatter: reduce-scatter the gradients as the same int8 blocks, sent to
            each chunk's owner by an all-to-all and summed there in fp32 (ZeRO++'s
            ``zero_quantized_gradients``, qgZ); the reduced gradient shard keeps its dtype.
        deterministic: the same bits at every data-parallel size (docs/deterministic.md):
            gradients summed (divide the loss by the global micro-batch count), by the tree
            over ranks and over micro-batches (``zero_grad(set_to_none=True)`` starts a
            step's), the clip norm summed exactly. Power-of-two groups; no ``no_sync``.

    torch FSDP's own arguments work too (``torch_args.py``): ``sharding_strategy`` as a
    ``ShardingStrategy``, ``backward_prefetch`` as a ``BackwardPrefetch`` (or None),
    ``cpu_offload`` as a ``CPUOffload``, ``mixed_precision=MixedPrecision(...)``,
    ``auto_wrap_policy`` (``ModuleWrapPolicy`` or a callable policy), ``device_id`` (the module
    is moved there), and ``use_orig_params`` / ``limit_all_gathers`` (accepted: parameters always
    stay the original tensors, and at most two units are gathered at once).
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        sharding_strategy: str = "full_shard",
        param_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        buffer_dtype: torch.dtype | None = None,
        wrap: list[str] | None = None,
        backward_prefetch: str = "backward_pre",
        forward_prefetch: bool = False,
        cpu_offload: bool = False,
        pin_memory: bool = True,
        activation_checkpointing: bool = False,
        sync_module_states: bool = False,
        state_dict_type: str = "full_state_dict",
        process_group: dist.ProcessGroup | None = None,
        mesh: tuple[int, int] | None = None,
        post_forward_shard_size: int | None = None,
        quantized_all_gather: bool = False,
        quantized_reduce_scatter: bool = False,
        auto_wrap_policy=None,
        mixed_precision=None,
        device_id: int | torch.device | None = None,
        use_orig_params: bool = True,
        limit_all_gathers: bool = True,
        ignored_modules=None,
        param_init_fn=None,
        deterministic: bool = False,
    ):
        super().__init__()
        for name, value in (("ignored_modules", ignored_modules), ("param_init_fn", param_init_fn)):
            if value is not None:
                raise ConfigError(f"{name} is not supported; build the model fully before wrapping")
        if wrap is not None and auto_wrap_policy is not None:
            raise ConfigError("pass wrap (unit names) or auto_wrap_policy, not both")
        sharding_strategy = torch_args.strategy_name(sharding_strategy)
        backward_prefetch = torch_args.prefetch_name(backward_prefetch)
        cpu_offload = torch_args.offload_flag(cpu_offload)
        if mixed_precision is not None:
            if any(d is not None for d in (param_dtype, reduce_dtype, buffer_dtype)):
                raise ConfigError("pass mixed_precision or the *_dtype arguments, not both")
            policy = precision.from_torch(mixed_precision)
        else:
            policy = precision.Precision(param_dtype, reduce_dtype, buffer_dtype)
        device = torch_args.device_of(device_id)
        if device is not None:
            module = module.to(device)
        if auto_wrap_policy is not None:
            wrap = torch_args.wrap_names(module, auto_wrap_policy)
        # torch's override: with units from a policy, these run as their own fp32 units
        full_precision = precision.full_precision_modules(module, policy) if wrap else []
        FSDPConfig(
            fsdp_sharding_strategy=sharding_strategy,
            fsdp_backward_prefetch=backward_prefetch,
            fsdp_state_dict_type=state_dict_type,
        ).validate()
        if not dist.is_initialized():
            raise RuntimeError(
                "FullyShardedDataParallel needs torch.distributed: call "
                "dist.init_process_group('shardwise') (or launch with torchrun) first"
            )
        self.module = module
        self.state_dict_type = state_dict_type
        self.precision = policy
        world = process_group or dist.group.WORLD
        self._world = world
        shard_group, replicate_group = _groups(sharding_strategy, world, mesh)
        post_forward = _post_forward(post_forward_shard_size, sharding_strategy, shard_group)
        if sync_module_states:
            broadcast_from_rank0(module, world)
        self._names = _parameter_names(module)
        units = _plan_units(module, (wrap or []) + full_precision)
        self._engine = _C.FsdpEngine(forward_prefetch, backward_prefetch, world)
        self._unit_params: list[list[nn.Parameter]] = []
        self._unit_names: list[str] = []
        reshard = sharding_strategy in ("full_shard", "hybrid_shard")
        for name, params in units:
            mixed = name not in full_precision
            index = self._engine.add_unit(
                params,
                name,
                shard_group,
                replicate_group,
                _dtype_name(policy.param_dtype if mixed else None),
                _dtype_name((policy.reduce_dtype or policy.param_dtype) if mixed else None),
                reshard and name != ROOT,
                cpu_offload,
                keep_low_precision_grads=mixed and policy.keep_low_precision_grads,
                pin_memory=pin_memory,
                deterministic=deterministic,
                post_forward_group=post_forward if reshard and name != ROOT else None,
                quantized_all_gather=bool(quantized_all_gather),
                quantized_reduce_scatter=bool(quantized_reduce_scatter),
            )
            self._unit_params.append(params)
            self._unit_names.append(name)
            if name == ROOT:
                self._engine.set_root(index)
                self._root = index
                continue
            unit = module.get_submodule(name)
            self._hook_unit(unit, index, activation_checkpointing)
            if not mixed:
                precision.hook_full_precision(unit)
            elif policy.param_dtype is not None:
                if policy.cast_forward_inputs:
                    precision.hook_unit_inputs(unit, policy.param_dtype)
                unit.forward = precision.explain_dtype_errors(
                    unit.forward, repr(name), policy.param_dtype
                )
        precision.cast_buffers(module, policy.buffer_dtype, keep=full_precision)
        self._root_forward = (  # a function, not the module (which would register it twice)
            self.module.__call__
            if policy.param_dtype is None
            else precision.explain_dtype_errors(self.module, ROOT, policy.param_dtype)
        )

    # --- forward / backward -------------------------------------------------------------

    def _hook_unit(self, module: nn.Module, index: int, checkpointed: bool) -> None:
        engine = self._engine
        module.register_forward_pre_hook(lambda _m, _args: engine.pre_forward(index))
        module.register_forward_hook(
            lambda _m, _args, out: engine.post_forward(index, _tensors(out))
        )
        if checkpointed:
            module.forward = functools.partial(_checkpointed, module.forward)

    def forward(self, *args, **kwargs):
        policy = self.precision  # torch's root rule: cast the inputs unless told not to
        if policy.cast_root_forward_inputs or policy.cast_forward_inputs:
            args, kwargs = precision.cast_floats(policy.param_dtype, (args, kwargs))
        self._engine.pre_forward(self._root)
        out = self._root_forward(*args, **kwargs)
        self._engine.post_forward(self._root, _tensors(out))
        return out

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate unsharded gradients without communication; the
        first backward after it reduces them all."""
        previous = self._engine.requires_gradient_sync()
        self._engine.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self._engine.set_requires_gradient_sync(previous)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips the sharded gradients by their global norm (computed across the shards)."""
        return torch.tensor(self._engine.clip_grad_norm_(float(max_norm), float(norm_type)))

    @contextlib.contextmanager
    def summon_full_params(self):
        """Every parameter full (in the compute dtype) inside the block; sharded again after."""
        for index in range(self._engine.num_units()):
            self._engine.unshard(index)
        try:
            yield
        finally:
            self._engine.reshard_all()

    def sharded_units(self) -> tuple:
        """(the process group, [(unit, its parameters)] in the engine's order): each unit
        answers ``shard_views()``, ``full_parameters()``, ``load_full_parameters(full)`` and
        ``shapes()``, as ``fully_shard``'s units do (``optim_state`` works on either)."""
        return self._world, [
            (_EngineUnit(self._engine, u), params) for u, params in enumerate(self._unit_params)
        ]

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held by this rank's parameter and gradient storages, counted from storages."""
        units = range(self._engine.num_units())
        return {
            "parameters": sum(self._engine.param_bytes(u) for u in units),
            "gradients": sum(self._engine.grad_bytes(u) for u in units),
        }

    # --- ownership --------------------------------------------------------------------------

    def units(self) -> list[str]:
        """The units in the engine's order: each wrapped submodule's name, ``"<root>"`` for the
        root unit (the parameters no wrapped submodule owns)."""
        return list(self._unit_names)

    def owned_slices(self, unit: int | None = None) -> list[OwnedSlice]:
        """This rank's slice of every parameter of ``unit`` (an index into ``units()``), or of
        every unit when ``None``, in unit and parameter order."""
        indices = range(len(self._unit_names)) if unit is None else [unit]
        slices = []
        for u in indices:
            params = self._unit_params[u]
            for p, (start, valid, numel) in zip(params, self._engine.owned_slices(u), strict=True):
                slices.append(OwnedSlice(self._names[id(p)][0], p, start, valid, numel))
        return slices

    # --- state dicts ----------------------------------------------------------------------

    def state_dict(self, *args, **kwargs):  # noqa: D102 (documented in docs/fsdp.md)
        from . import state_dict

        return state_dict.get(self, self.state_dict_type)

    def load_state_dict(self, state, strict: bool = True, assign: bool = False):  # noqa: D102
        from . import state_dict

        return state_dict.load(self, state, self.state_dict_type, strict)


# The keys that cut a whole model into units: a module wrapped as one unit has no use for them.
UNIT_KEYS = ("fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls", "fsdp_min_num_params")


def wrap(
    module: nn.Module,
    config,
    *,
    process_group=None,
    one_unit: bool = False,
    deterministic: bool = False,
) -> nn.Module:
    """Wraps ``module`` as the ``distributed:`` section of a config says (the FSDP config keys).
    Returns the module unchanged when ``use_fsdp`` is false. ``one_unit``: ``module`` is one
    unit (a pipeline stage); the wrapping keys a mapping gives are named in a warning, and
    hybrid sharding, which needs its own mesh, is refused. ``deterministic``: the engine's
    deterministic mode (``FullyShardedDataParallel``'s argument)."""
    cfg = config if isinstance(config, FSDPConfig) else FSDPConfig.from_mapping(config)
    _check_other_parallelisms(cfg.extra)
    if not cfg.use_fsdp:
        return module
    policy = str(cfg.fsdp_auto_wrap_policy).lower()
    if one_unit:
        _check_one_unit(cfg, [k for k in UNIT_KEYS if isinstance(config, dict) and k in config])
        units = []
    elif policy == "transformer_auto_wrap":
        if isinstance(config, dict) and "fsdp_min_num_params" in config:
            warnings.warn(
                "fsdp_min_num_params ignored: it bounds size_based_auto_wrap; with "
                "transformer_auto_wrap every transformer block is a unit",
                stacklevel=2,
            )
        units = auto_wrap.transformer_blocks(module, cfg.fsdp_transformer_layer_cls)
    elif policy == "size_based_auto_wrap":
        units = auto_wrap.size_based(module, cfg.fsdp_min_num_params)
    else:
        units = []
    mixed = None
    if cfg.fsdp_mixed_precision:  # torch's MixedPrecision, with its defaults for the rest
        mixed = MixedPrecision(
            param_dtype=dtype_of("fsdp_param_dtype", cfg.fsdp_param_dtype),
            reduce_dtype=dtype_of("fsdp_reduce_dtype", cfg.fsdp_reduce_dtype),
            buffer_dtype=dtype_of("fsdp_buffer_dtype", cfg.fsdp_buffer_dtype),
        )
    return FullyShardedDataParallel(
        module,
        sharding_strategy=cfg.fsdp_sharding_strategy,
        mixed_precision=mixed,
        wrap=units,
        backward_prefetch=str(cfg.fsdp_backward_prefetch).lower(),
        forward_prefetch=cfg.fsdp_forward_prefetch,
        cpu_offload=cfg.fsdp_cpu_offload,
        activation_checkpointing=cfg.gradient_checkpointing,
        sync_module_states=cfg.sync_module_states,
        state_dict_type=cfg.fsdp_state_dict_type,
        process_group=process_group,
        mesh=mesh_axes(cfg.mesh_shape) if cfg.mesh_shape is not None else None,
        deterministic=deterministic,
    )


# --- helpers --------------------------------------------------------------------------------


def _check_one_unit(cfg: FSDPConfig, given: list[str]) -> None:
    if cfg.fsdp_sharding_strategy == "hybrid_shard" or cfg.mesh_shape is not None:
        raise ConfigError(
            "fsdp_sharding_strategy hybrid_shard / mesh_shape: a pipeline stage is sharded over "
            "the run's fsdp axis; give the mesh dp and fsdp axes (model.mesh_shape) instead"
        )
    if given:
        warnings.warn(
            f"distributed.fsdp: {', '.join(given)} ignored: each pipeline stage is one FSDP unit",
            stacklevel=3,
        )


def _check_other_parallelisms(extra: dict) -> None:
    """Keys of the ``distributed:`` section that ask for more than FSDP are errors here, not
    silently dropped: wrap() shards over the data-parallel ranks only."""
    where = {
        "tensor_parallel_size": "shardwise.tensor_parallel.parallelize(model, mesh) first",
        "pipeline_parallel_size": "shardwise.pipeline",
    }
    for key, use in where.items():
        if int(extra.get(key) or 1) > 1:
            raise ConfigError(
                f"{key}={extra[key]}: shardwise.wrap does FSDP only; use {use}, or "
                "shardwise-train, which composes them"
            )
    if extra.get("use_zero") or int(extra.get("zero_stage") or 0) > 0:
        raise ConfigError(
            "use_zero / zero_stage: shardwise.wrap does FSDP; for ZeRO: shardwise.zero.initialize"
        )
    for key in ("pipeline_schedule", "num_microbatches"):
        if extra.get(key) is not None:
            raise ConfigError(f"{key} has no effect without pipeline_parallel_size > 1; drop it")
    _check_launch_keys(extra)


def _check_launch_keys(extra: dict) -> None:
    """The launch keys say how the process group was made, and wrap() is given it made: those
    it can compare with the group are errors when they disagree; the others are named in one
    warning."""
    if dist.is_initialized():
        world = dist.get_world_size()
        nodes, per_node = extra.get("num_nodes"), extra.get("num_processes_per_node")
        given = {
            "world_size": (extra.get("world_size"), world),
            "rank": (extra.get("rank"), dist.get_rank()),
            "num_nodes x num_processes_per_node": (
                int(nodes) * int(per_node) if nodes is not None and per_node is not None else None,
                world,
            ),
        }
        for key, (value, actual) in given.items():
            if value is not None and int(value) != actual:
                raise ConfigError(
                    f"{key}={value} but the process group says {actual}; fix the config or the "
                    "launch"
                )
        backend = extra.get("backend")
        if backend is not None and str(backend) not in str(dist.get_backend()):
            raise ConfigError(
                f"backend={backend} but the process group runs {dist.get_backend()}; fix the "
                "config or init_process_group"
            )
    unused = [k for k in ("local_rank", "master_addr", "master_port") if k in extra]
    if unused:
        warnings.warn(
            f"{', '.join(unused)} ignored by shardwise.wrap: they are read by whoever "
            "initialized the process group (torchrun, init_process_group)",
            stacklevel=3,
        )


def _tensors(out) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _checkpointed(forward: Callable, *args, **kwargs):
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _parameter_names(module: nn.Module) -> dict[int, list[str]]:
    """Every name of every parameter (tied parameters have several)."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def _plan_units(module: nn.Module, wrap: list[str]) -> list[tuple[str, list[nn.Parameter]]]:
    """(unit name, its parameters), children first, the root (the rest) last. A parameter
    shared by two units is an error naming both (see FsdpEngine::add_unit)."""
    order = {name: i for i, (name, _) in enumerate(module.named_modules())}
    for name in wrap:
        if name not in order:
            raise ValueError(f"wrap: no submodule named {name!r}")
    taken: dict[int, str] = {}
    units = []
    for name in sorted(set(wrap), key=lambda n: -order[n]):
        params = []
        for p in module.get_submodule(name).parameters():
            if id(p) in taken:
                if not taken[id(p)].startswith(name + "."):
                    raise ValueError(
                        f"a parameter of {name!r} is shared with unit {taken[id(p)]!r}; a "
                        "shared (tied) parameter must live in one unit: wrap their common "
                        "parent instead, or leave both modules in the root unit"
                    )
                continue
            taken[id(p)] = name
            params.append(p)
        units.append((name, params))
    seen: set[int] = set()
    rest = []
    for p in module.parameters():
        if id(p) not in taken and id(p) not in seen:
            seen.add(id(p))
            rest.append(p)
    units.append((ROOT, rest))
    _check_shared_with_root(module, wrap, taken)
    return units


def _check_shared_with_root(module: nn.Module, wrap: list[str], taken: dict[int, str]) -> None:
    """A parameter owned by a unit but also used by a module outside every unit (e.g. a head
    tied to an embedding that was wrapped alone) would be used while sharded."""
    wrapped = set(wrap)
    for name, sub in module.named_modules():
        if any(name == w or name.startswith(w + ".") for w in wrapped):
            continue
        for p in sub.parameters(recurse=False):
            if id(p) in taken:
                raise ValueError(
                    f"parameter of {name or ROOT!r} is tied to one in unit {taken[id(p)]!r}; "
                    "a shared (tied) parameter must live in one unit: do not wrap "
                    f"{taken[id(p)]!r} separately (leave it in the root unit)"
                )


def _groups(strategy: str, world, mesh):
    """(shard group, replicate group) of this rank for the strategy."""
    size = dist.get_world_size(world)
    if strategy in ("full_shard", "shard_grad_op"):
        return world, None
    if strategy == "no_shard":
        return None, world
    replicas, shards = mesh or (size // _local_world_size(size), _local_world_size(size))
    if replicas * shards != size:
        raise ValueError(
            f"hybrid_shard: the mesh ({replicas} replicas x {shards} shards) does not match the "
            f"world size {size}; give mesh_shape [[replicas, shards], ['dp', 'fsdp']] with "
            "replicas * shards == world size"
        )
    # the one mesh layout (csrc/mesh/): shards within runs of adjacent ranks, replicas across
    layout = _C.MeshLayout([replicas, shards], ["dp", "fsdp"], size)
    ranks, me = dist.get_process_group_ranks(world), dist.get_rank(world)
    mine = {}
    for axis in ("fsdp", "dp"):  # every rank creates every group, in the same order
        for members in layout.groups([axis]):
            group = dist.new_group([ranks[i] for i in members])
            if me in members:
                mine[axis] = group
    return mine["fsdp"], mine["dp"]


_POST_FORWARD_GROUPS: dict[tuple[int, ...], dist.ProcessGroup] = {}


def post_forward_group(ranks: list[int], size: int) -> dist.ProcessGroup:
    """The group of ``size`` consecutive ranks of ``ranks`` (a shard group's, in its order) that
    holds this rank. A unit resharded after forward keeps its parameters sharded over it, and
    backward all-gathers within it (FSDP2's int reshard_after_forward; DeepSpeed ZeRO++'s hpZ
    partition, which takes consecutive ranks too). Made once per set of ranks, by its own ranks
    only (``use_local_synchronization``)."""
    me = dist.get_rank()
    rows = (tuple(ranks[i : i + size]) for i in range(0, len(ranks), size))
    row = next(r for r in rows if me in r)
    if row not in _POST_FORWARD_GROUPS:
        _POST_FORWARD_GROUPS[row] = dist.new_group(list(row), use_local_synchronization=True)
    return _POST_FORWARD_GROUPS[row]


def _post_forward(size, strategy: str, shard_group) -> dist.ProcessGroup | None:
    """The post_forward_shard_size argument's group (None: the whole shard group), checked."""
    if size is None:
        return None
    if strategy not in ("full_shard", "hybrid_shard"):
        raise ConfigError(
            f"post_forward_shard_size={size!r} needs a strategy that reshards after forward "
            f"(full_shard or hybrid_shard), not {strategy}; leave it out"
        )
    shards = dist.get_world_size(shard_group)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or shards % size:
        raise ConfigError(
            f"post_forward_shard_size={size!r} must be a factor of the shard group's size "
            f"{shards}, such as the ranks per host; or leave it out"
        )
    if size == shards:
        return None
    return post_forward_group(dist.get_process_group_ranks(shard_group), size)


def _local_world_size(size: int) -> int:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    return local if size % local == 0 else size


class _EngineUnit:
    """One unit of the engine, with the unit's own calls (the engine's take its index)."""

    def __init__(self, engine, index: int):
        self._engine, self._index = engine, index

    def shard_views(self) -> list[torch.Tensor]:
        return self._engine.shard_views(self._index)

    def full_parameters(self) -> list[torch.Tensor]:
        return self._engine.full_parameters(self._index)

    def load_full_parameters(self, full: list[torch.Tensor]) -> None:
        self._engine.load_full_parameters(self._index, full)

    def shapes(self) -> list:
        return self._engine.shapes(self._index)


def broadcast_from_rank0(module: nn.Module, world) -> None:
    """Every parameter and buffer of ``module`` set to the group's first rank's (FSDP's
    ``sync_module_states``)."""
    source = dist.get_global_rank(world, 0)
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=source, group=world)
