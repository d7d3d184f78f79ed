"""``shardwise.fully_shard``: FSDP2's per-module API (``torch.distributed.fsdp.fully_shard``)
over the C++ engine.

Called bottom-up, as FSDP2 and torchtitan call it: once per block, then on the root. Each call
makes one unit (``csrc/fsdp/fsdp_unit.h``) of the module's parameters that no earlier call on a
submodule took, and shards them in place, so an optimizer built afterwards over
``model.parameters()`` steps the shards. The module's class becomes ``FSDP<Class>`` (a subclass
of ``FSDPModule`` and of its own class), as in FSDP2.

The first wrapped module whose forward runs is the root: it makes the engine
(``csrc/fsdp/fsdp_engine.h``), which adopts the unit of every wrapped module beneath it. Forward
and backward then go as under ``FullyShardedDataParallel``: the engine unshards, reshards,
prefetches and reduces; this file only registers the hooks, casts inputs and outputs as the
``MixedPrecisionPolicy`` says, and maps state dicts to names.

What differs from FSDP2: parameters are not DTensors. Between steps each parameter's data is this
rank's piece of the flattened unit (the flat layout, ``csrc/sharding/flat_layout.h``), not a
dim-0 shard, so ``state_dict()`` gathers full tensors (every rank must call it) where FSDP2
returns DTensors; ``sharded_state_dict()`` gives this rank's pieces without communication.
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from .. import _C
from .module import FullyShardedDataParallel, post_forward_group
from .precision import cast_floats

_STATE = "_shardwise_fully_shard"
_NO_MIXED_PRECISION = MixedPrecisionPolicy()  # FSDP2's defaults, one object each as in torch
_NO_OFFLOAD = OffloadPolicy()
_CLASSES: dict[type, type] = {}
_GATHERING = threading.local()  # inside FSDPModule.state_dict: nested calls stay plain


class _State:
    """One fully_shard call: its modules, its unit, its policy; the engine once a root ran."""

    def __init__(self, modules, params, unit, policy, auto_reshard, groups):
        self.modules = modules
        self.params = params
        self.unit = unit
        self.policy = policy
        self.auto_reshard = auto_reshard
        self.shard_group, self.replicate_group = groups
        self.engine = None
        self.index = -1
        self.forward_prefetch: list[_State] = []
        self.backward_prefetch: list[_State] = []


def _state_of(module: nn.Module) -> _State | None:
    return module.__dict__.get(_STATE)


def fully_shard(
    module,
    *,
    mesh=None,
    reshard_after_forward: bool | int | None = None,
    shard_placement_fn=None,
    mp_policy: MixedPrecisionPolicy = _NO_MIXED_PRECISION,
    offload_policy: OffloadPolicy = _NO_OFFLOAD,
    ignored_params: set[nn.Parameter] | None = None,
):
    """Shards ``module`` (or a list of modules, one unit for all) as FSDP2's ``fully_shard``
    does, in place; returns it. See docs/fsdp.md ("fully_shard")."""
    modules = _check_modules(module)
    _check_arguments(reshard_after_forward, shard_placement_fn, mp_policy, offload_policy)
    groups = _groups(mesh)
    reshard, post_forward = _resharding(reshard_after_forward, groups[0])
    ignored = {id(p) for p in ignored_params or ()}
    params = _managed_params(modules, ignored)
    unit = _C.FsdpUnit(
        params,
        type(modules[0]).__name__,
        groups[0],
        groups[1],
        _dtype_name(mp_policy.param_dtype),
        _dtype_name(mp_policy.reduce_dtype or mp_policy.param_dtype),
        reshard,
        isinstance(offload_policy, CPUOffloadPolicy),
        isinstance(offload_policy, CPUOffloadPolicy) and offload_policy.pin_memory,
        post_forward,
    )
    state = _State(modules, params, unit, mp_policy, reshard_after_forward is None, groups)
    for m in modules:
        m.__dict__[_STATE] = state
        m.register_forward_pre_hook(_pre_forward, prepend=True, with_kwargs=True)
        m.register_forward_hook(_post_forward)
        cls = type(m)
        if cls not in _CLASSES:
            _CLASSES[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
        m.__class__ = _CLASSES[cls]
    return module


# --- checks: every argument before any work ------------------------------------------------


def _check_modules(module) -> list[nn.Module]:
    modules = list(module) if isinstance(module, list | tuple) else [module]
    if not modules or not all(isinstance(m, nn.Module) for m in modules):
        raise TypeError(
            f"fully_shard: module must be an nn.Module or a list of them, not {module!r}"
        )
    for m in modules:
        if _state_of(m) is not None:
            raise ValueError(
                f"fully_shard: {type(m).__name__} is already sharded by fully_shard; call it "
                "once per module (bottom-up: each block, then the root)"
            )
        if isinstance(m, torch.distributed.fsdp.FSDPModule | FullyShardedDataParallel):
            raise ValueError(
                f"fully_shard: {type(m).__name__} is already wrapped by another FSDP; shard the "
                "plain model with one API"
            )
    if not dist.is_initialized():
        raise RuntimeError(
            "fully_shard needs torch.distributed: call dist.init_process_group('shardwise') "
            "(or launch with torchrun) first"
        )
    return modules


def _check_arguments(reshard_after_forward, shard_placement_fn, mp_policy, offload_policy):
    if reshard_after_forward is not None and not isinstance(reshard_after_forward, int):
        raise ValueError(
            f"fully_shard: reshard_after_forward={reshard_after_forward!r}: pass True, False, "
            "None, or an int (the group size to reshard to after forward)"
        )
    if shard_placement_fn is not None:
        raise ValueError(
            "fully_shard: shard_placement_fn is not supported: shardwise shards each unit's "
            "flattened parameters evenly (not per dimension); drop the argument"
        )
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(
            f"fully_shard: mp_policy must be torch.distributed.fsdp.MixedPrecisionPolicy, not "
            f"{type(mp_policy).__name__}; FSDP1's MixedPrecision goes to "
            "shardwise.FullyShardedDataParallel(mixed_precision=...)"
        )
    if not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(
            f"fully_shard: offload_policy must be torch.distributed.fsdp.OffloadPolicy or "
            f"CPUOffloadPolicy, not {type(offload_policy).__name__}"
        )


def _groups(mesh):
    """(shard group, replicate group) of this rank: a 1-D mesh shards, a 2-D mesh replicates
    over dim 0 and shards over dim 1 (HSDP), as FSDP2 reads them; None: shard over the world."""
    if mesh is None:
        return dist.group.WORLD, None
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise TypeError(
            f"fully_shard: mesh must be a DeviceMesh (init_device_mesh), not {type(mesh).__name__}"
        )
    if mesh.ndim not in (1, 2):
        raise ValueError(
            f"fully_shard: mesh has {mesh.ndim} dimensions; pass a 1-D mesh (FSDP) or a 2-D "
            "(replicate, shard) mesh (HSDP), e.g. mesh['dp', 'fsdp'] of a larger mesh"
        )
    if mesh.get_coordinate() is None:
        raise ValueError(
            f"fully_shard: rank {dist.get_rank()} is not in the mesh {mesh.mesh.tolist()}; "
            "every rank that calls fully_shard must be in its mesh"
        )
    if mesh.ndim == 1:
        return mesh.get_group(0), None
    return mesh.get_group(1), mesh.get_group(0)


def _resharding(reshard_after_forward, shard_group):
    """(reshard after forward?, the post-forward group or None): FSDP2's reading of an int N,
    a factor of the shard group's size: the shard dim's ranks in groups of N consecutive ones
    (``mesh.mesh.view(-1, N)``, ``module.post_forward_group``); N = 1 is False and N = the
    size is True."""
    if reshard_after_forward is None or isinstance(reshard_after_forward, bool):
        return reshard_after_forward is not False, None
    n, size = reshard_after_forward, dist.get_world_size(shard_group)
    if n < 1 or n > size or size % n:
        raise ValueError(
            f"fully_shard: reshard_after_forward={n}: an int must be a factor of the shard "
            f"group's size {size} (e.g. the GPUs per node); or pass True or False"
        )
    if n == 1:
        warnings.warn(
            "fully_shard: reshard_after_forward=1 (int) reshards to one rank, i.e. keeps the "
            "parameters after forward, as reshard_after_forward=False does",
            stacklevel=3,
        )
        return False, None
    if n == size:
        return True, None
    return True, post_forward_group(dist.get_process_group_ranks(shard_group), n)


def _managed_params(modules: list[nn.Module], ignored: set[int]) -> list[nn.Parameter]:
    """The modules' parameters that no earlier fully_shard on a submodule took, each once,
    ignored ones left out (FSDP2's rule: call it bottom-up)."""
    taken = {id(p) for p in ignored}
    for m in modules:
        for sub in m.modules():
            state = _state_of(sub)
            if state is not None and sub not in modules:
                taken.update(id(p) for p in state.params)
    params = []
    for m in modules:
        for p in m.parameters():
            if id(p) not in taken:
                taken.add(id(p))
                params.append(p)
    return params


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


# --- forward: the engine's hooks --------------------------------------------------------------


def _lazy_init(root: nn.Module) -> None:
    """The first wrapped module to run is the root: one engine adopts every unit beneath it."""
    state = _state_of(root)
    engine = _C.FsdpEngine(False, "backward_pre", state.shard_group)
    adopted: list[_State] = []
    for m in root.modules():
        sub = _state_of(m)
        if sub is None or any(sub is s for s in adopted):
            continue
        if sub.engine is not None:
            raise RuntimeError(
                f"fully_shard: {type(m).__name__} ran forward on its own before its parent "
                f"{type(root).__name__}; run the model from its root"
            )
        sub.engine, sub.index = engine, engine.adopt_unit(sub.unit)
        adopted.append(sub)
    engine.set_root(state.index)
    if state.auto_reshard:  # FSDP2: the root keeps its parameters for the backward right after
        state.unit.set_reshard_after_forward(False)
    for sub in adopted:
        _push_prefetch(sub)


def _push_prefetch(state: _State) -> None:
    for targets, setter in (
        (state.forward_prefetch, state.engine.set_forward_prefetch),
        (state.backward_prefetch, state.engine.set_backward_prefetch),
    ):
        if any(t.engine is not state.engine for t in targets):
            raise ValueError(
                "set_modules_to_*_prefetch: every module must be sharded under the same root "
                "(fully_shard the model they belong to)"
            )
        setter(state.index, [t.index for t in targets])


def _pre_forward(module, args, kwargs):
    state = _state_of(module)
    if state.engine is None:
        _lazy_init(module)
    policy = state.policy
    if policy.cast_forward_inputs and policy.param_dtype is not None:
        args, kwargs = cast_floats(policy.param_dtype, (args, kwargs))
    state.engine.pre_forward(state.index)
    return args, kwargs


def _post_forward(module, _args, output):
    state = _state_of(module)
    tensors = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    state.engine.post_forward(state.index, tensors)
    return cast_floats(state.policy.output_dtype, output)


# --- the module face ----------------------------------------------------------------------------


class UnshardHandle:
    """FSDP2's handle of ``unshard(async_op=True)``: ``wait()`` finishes the all-gather."""

    def __init__(self, unit):
        self._unit = unit

    def wait(self) -> None:
        if self._unit is not None:
            self._unit.unshard()
            self._unit = None


class FSDPModule:
    """The methods FSDP2 adds to a sharded module (``torch.distributed.fsdp.FSDPModule``)."""

    def __new__(cls, *args, **kwargs):
        """A container indexing itself (``Sequential[1:]``) builds its own class, not ours."""
        orig = cls.__mro__[2]
        self = orig.__new__(orig, *args, **kwargs)
        self.__init__(*args, **kwargs)
        return self

    def _fully_shard_states(self, recurse: bool) -> list[_State]:
        modules = self.modules() if recurse else [self]
        states: list[_State] = []
        for m in modules:
            state = _state_of(m)
            if state is not None and not any(state is s for s in states):
                states.append(state)
        return states

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        """All-gathers this module's parameters (in ``param_dtype``); not recursive."""
        unit = _state_of(self).unit
        unit.unshard_async()
        handle = UnshardHandle(unit)
        if async_op:
            return handle
        handle.wait()
        return None

    def reshard(self) -> None:
        """Frees this module's gathered parameters; the shards are registered again."""
        _state_of(self).unit.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse=True) -> None:
        """False: backward accumulates unsharded gradients without communication (FSDP1's
        ``no_sync``); the first backward with True reduces them all."""
        for state in self._fully_shard_states(recurse):
            state.unit.set_requires_gradient_sync(bool(requires_gradient_sync))

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse=True) -> None:
        """Whether forward frees the gathered parameters (the root's default is False); as in
        FSDP2 a bool, True resharding to the whole shard group (an int given to fully_shard is
        dropped)."""
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(
                f"set_reshard_after_forward: {reshard_after_forward!r} must be a bool (FSDP2's "
                "setter); pass an int group size to fully_shard instead"
            )
        for state in self._fully_shard_states(recurse):
            state.unit.set_reshard_after_forward(reshard_after_forward)
            state.auto_reshard = False

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse=True) -> None:
        """False: backward keeps the parameters gathered, so the next forward (a further
        micro-batch) all-gathers nothing; reshard before the optimizer steps."""
        for state in self._fully_shard_states(recurse):
            state.unit.set_reshard_after_backward(bool(reshard_after_backward))

    def set_modules_to_forward_prefetch(self, modules: list[FSDPModule]) -> None:
        """This module's forward starts the all-gathers of ``modules`` after its own."""
        self._set_prefetch("forward_prefetch", modules)

    def set_modules_to_backward_prefetch(self, modules: list[FSDPModule]) -> None:
        """This module's backward starts the all-gathers of ``modules`` (instead of the module
        before it in forward order)."""
        self._set_prefetch("backward_prefetch", modules)

    def _set_prefetch(self, which: str, modules) -> None:
        targets = [_state_of(m) for m in modules]
        if any(t is None for t in targets):
            raise ValueError(f"set_modules_to_{which}: every module must be sharded by fully_shard")
        state = _state_of(self)
        setattr(state, which, targets)
        if state.engine is not None:
            _push_prefetch(state)

    # --- state dicts: full tensors by the plain model's names ---------------------------------

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """The plain model's state dict: full parameters (all-gathered: every rank calls it)
        in their own dtype, and the buffers. Loads into the unwrapped model."""
        if getattr(_GATHERING, "active", False):
            return super().state_dict(
                *args, destination=destination, prefix=prefix, keep_vars=keep_vars
            )
        full = {}
        for state in self._fully_shard_states(recurse=True):
            for p, tensor in zip(state.params, state.unit.full_parameters(), strict=True):
                full[id(p)] = tensor
        _GATHERING.active = True
        try:
            out = super().state_dict(
                *args, destination=destination, prefix=prefix, keep_vars=keep_vars
            )
        finally:
            _GATHERING.active = False
        for name, p in self.named_parameters(remove_duplicate=False):
            if id(p) in full:
                out[prefix + name] = full[id(p)]
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Loads a full state dict (the plain model's, or ``state_dict()``'s at any world size):
        each rank keeps its pieces; no communication."""
        names: dict[int, list[str]] = {}
        for name, p in self.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        rest, missing, sharded = dict(state_dict), [], set()
        for state in self._fully_shard_states(recurse=True):
            tensors = []
            for p, shape in zip(state.params, state.unit.shapes(), strict=True):
                sharded.update(names[id(p)])
                keys = [n for n in names[id(p)] if n in state_dict]
                if not keys:
                    missing.append(names[id(p)][0])
                    continue
                for key in keys:
                    rest.pop(key)
                if tuple(state_dict[keys[0]].shape) != tuple(shape):
                    raise RuntimeError(
                        f"load_state_dict: {keys[0]} has shape {tuple(state_dict[keys[0]].shape)}"
                        f" but the parameter has {tuple(shape)}"
                    )
                tensors.append(state_dict[keys[0]])
            if len(tensors) == len(state.params):
                with torch.no_grad():
                    state.unit.load_full_parameters(tensors)
        result = super().load_state_dict(rest, strict=False, assign=assign)
        missing += [k for k in result.missing_keys if k not in sharded]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(
                f"Error(s) in loading state_dict for {type(self).__name__}: missing keys "
                f"{missing}, unexpected keys {result.unexpected_keys}"
            )
        return nn.modules.module._IncompatibleKeys(missing, result.unexpected_keys)

    def _pieces(self):
        """(name in the plain model, this rank's piece, (start, valid, numel)) of every sharded
        parameter beneath this module: what the three methods below give."""
        names = {id(p): n for n, p in self.named_parameters()}
        for state in self._fully_shard_states(recurse=True):
            unit = state.unit
            for p, view, piece in zip(
                state.params, unit.shard_views(), unit.owned_slices(), strict=True
            ):
                yield names[id(p)], view, tuple(piece)

    def sharded_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's piece of every parameter (1-D, no communication) by the plain model's
        names, with ``owned_slices()`` saying where each sits in the flattened parameter."""
        return {name: view.detach().clone() for name, view, _ in self._pieces()}

    def checkpoint_slots(self) -> list:
        """What this rank holds, as shardwise checkpoint slots (``shardwise.pieces``):
        each parameter's piece (by the plain model's name and its first element) and each
        persistent buffer whole. ``pieces.to_pieces(slots)`` saved with
        ``shardwise.train.checkpoint.save`` loads with ``pieces.fill`` into a model sharded at
        any world size, or into the plain model."""
        from ..pieces import Slot
        from .state_dict import persistent_buffers

        slots = [Slot(name, piece[0], view) for name, view, piece in self._pieces()]
        for name, buffer in persistent_buffers(self).items():
            slots.append(Slot(name, 0, buffer.view(-1)))
        return slots

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips the gradients of every unit under this root by their global norm, computed
        across the shards (what ``torch.nn.utils.clip_grad_norm_`` computes over FSDP2's
        DTensors); returns the norm before clipping. Call it on the root after backward;
        ``ignored_params`` are not counted."""
        state = _state_of(self)
        if state is None or state.engine is None:
            raise RuntimeError(
                "clip_grad_norm_: call it on the fully_shard root after a forward and backward"
            )
        return torch.tensor(state.engine.clip_grad_norm_(float(max_norm), float(norm_type)))

    def sharded_units(self) -> tuple:
        """(the shard group, [(unit, its parameters)]) of every unit beneath this module, in
        one order on every rank (``optim_state`` gathers the optimizer's state through them)."""
        states = self._fully_shard_states(recurse=True)
        return states[0].shard_group, [(state.unit, state.params) for state in states]

    def owned_slices(self) -> dict[str, tuple[int, int, int]]:
        """(start, valid, numel) of this rank's piece of every sharded parameter, by name: the
        elements [start, start + valid) of the flattened parameter of numel elements."""
        return {name: piece for name, _, piece in self._pieces()}

    @contextlib.contextmanager
    def summon_full_params(self):
        """Every parameter beneath this module gathered (in ``param_dtype``) inside the block."""
        states = self._fully_shard_states(recurse=True)
        for state in states:
            state.unit.unshard()
        try:
            yield
        finally:
            for state in states:
                state.unit.reshard()


__all__ = ["FSDPModule", "UnshardHandle", "fully_shard"]
