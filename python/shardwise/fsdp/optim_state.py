"""The optimizer state of a sharded model (``FullyShardedDataParallel``, or a model
``fully_shard`` sharded), whole: what torch FSDP's ``FSDP.optim_state_dict`` /
``optim_state_dict_to_load`` give a checkpoint written by one rank. The model names its units
(``model.sharded_units()``: the group, and each unit with its parameters).

The optimizer steps the sharded parameters, so each state tensor shaped like one (Adam's
``exp_avg``, ``exp_avg_sq``) holds this rank's slice. ``full_optim_state_dict`` gathers each
into the parameter's full shape with the unit's own all-gather (the state is put into the shard
views, gathered as the parameters are, and the parameters put back), so the flat layout's rule
is not written again here; scalars (``step``) and the param groups are kept as they are.
``load_full_optim_state_dict`` is the inverse: each rank keeps its slice (no communication).
Both are collective over the model's ranks and keep torch's ``state_dict`` shape (state by
parameter index, ``param_groups``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist


def _params(optimizer) -> list:
    """The optimizer's parameters in ``state_dict``'s index order."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _positions(units, optimizer) -> dict[int, tuple[int, int]]:
    """Optimizer parameter index -> (unit, position in the unit) for the model's shards."""
    where = {
        id(p): (unit, i) for unit, (_, params) in enumerate(units) for i, p in enumerate(params)
    }
    return {i: where[id(p)] for i, p in enumerate(_params(optimizer)) if id(p) in where}


def _sharded_keys(optimizer, positions, group) -> dict[int, list[str]]:
    """Per unit, the state keys whose tensors are shaped like the shards, agreed by every rank
    of the model (each gathers the same keys, in one order, or the gathers would not pair)."""
    keys: dict[int, set] = {}
    params = _params(optimizer)
    for index, (unit, _) in positions.items():
        shard = params[index]
        for key, value in optimizer.state.get(shard, {}).items():
            if torch.is_tensor(value) and value.shape == shard.shape and value.dim() > 0:
                keys.setdefault(unit, set()).add(key)
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, keys, group=group)
    agreed: dict[int, set] = {}
    for theirs in everyone:
        for unit, unit_keys in theirs.items():
            agreed.setdefault(unit, set()).update(unit_keys)
    return {unit: sorted(k) for unit, k in sorted(agreed.items())}


@contextlib.contextmanager
def _borrowed_views(unit):
    """The unit's shard views, lent for other tensors: the parameters' own values are put back
    on leaving."""
    views = unit.shard_views()
    saved = [v.detach().clone() for v in views]
    try:
        yield views
    finally:
        with torch.no_grad():
            for view, value in zip(views, saved, strict=True):
                view.copy_(value)


def _gathered(unit, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` (one shard-shaped tensor per parameter of the unit) whole: gathered as the
    parameters are (collective)."""
    with _borrowed_views(unit) as views, torch.no_grad():
        for view, tensor in zip(views, tensors, strict=True):
            view.copy_(tensor.reshape(view.shape))
        return [t.detach().clone() for t in unit.full_parameters()]


def _sliced(unit, full: list[torch.Tensor]) -> list[torch.Tensor]:
    """This rank's slice of each of ``full`` (the unit's load rule; no communication)."""
    with _borrowed_views(unit) as views:
        unit.load_full_parameters(full)
        return [v.detach().clone() for v in views]


def full_optim_state_dict(model, optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()`` with every sharded state tensor whole (on every rank)."""
    out = type(optimizer).state_dict(optimizer)  # the class's: callers may patch the object's
    # torch's state_dict shares each parameter's state mapping with the optimizer: copy them
    out["state"] = {index: dict(entry) for index, entry in out["state"].items()}
    group, units = model.sharded_units()
    positions = _positions(units, optimizer)
    for unit, unit_keys in _sharded_keys(optimizer, positions, group).items():
        members = {i: pos for i, (u, pos) in positions.items() if u == unit}
        ops, params = units[unit]
        for key in unit_keys:
            state = optimizer.state
            tensors = [
                state[p][key] if key in state.get(p, {}) else torch.zeros_like(p) for p in params
            ]
            full = _gathered(ops, tensors)
            for index, pos in members.items():
                if key in out["state"].get(index, {}):
                    out["state"][index][key] = full[pos]
    return out


def load_full_optim_state_dict(model, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Loads a ``full_optim_state_dict`` (from any world size): each rank keeps its slices."""
    params = _params(optimizer)
    local = {
        "param_groups": state["param_groups"],
        "state": {index: dict(entry) for index, entry in state["state"].items()},
    }
    _, units = model.sharded_units()
    by_unit: dict[int, dict[int, int]] = {}
    for index, (unit, pos) in _positions(units, optimizer).items():
        by_unit.setdefault(unit, {})[pos] = index
    for unit, members in by_unit.items():
        keys = {
            key
            for index in members.values()
            for key, value in state["state"].get(index, {}).items()
            if torch.is_tensor(value) and value.dim() > 0
        }
        shapes = units[unit][0].shapes()
        for key in sorted(keys):
            full = [
                state["state"].get(members.get(i), {}).get(key, torch.zeros(shape))
                for i, shape in enumerate(shapes)
            ]
            pieces = _sliced(units[unit][0], full)
            for pos, index in members.items():
                if key in local["state"].get(index, {}):
                    local["state"][index][key] = pieces[pos].reshape(params[index].shape)
    type(optimizer).load_state_dict(optimizer, local)
