"""State dicts of a FullyShardedDataParallel model, keyed by the unwrapped model's names.

- ``full_state_dict``: full parameters (all-gathered by the C++ units; every rank takes part)
  and buffers, in the parameters' own dtype: ``model.state_dict()`` of the plain model, loadable
  into it, or into a wrapped model at any world size.
- ``sharded_state_dict``: this rank's piece of each parameter (a 1-D tensor) plus metadata; no
  communication. Loads into a model wrapped the same way at the same world size.
- ``local_state_dict``: each unit's pieces as one flat tensor per unit plus metadata; no
  communication; same world size.
"""

from __future__ import annotations

import torch

META = "_shardwise_fsdp"


def persistent_buffers(root: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The persistent buffers (the ones ``state_dict`` holds), by their full names."""
    out = {}
    for prefix, module in root.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b is not None and name not in module._non_persistent_buffers_set:
                out[f"{prefix}.{name}" if prefix else name] = b
    return out


def get(fsdp, kind: str) -> dict:
    engine, names = fsdp._engine, fsdp._names
    state: dict = {}
    if kind == "full_state_dict":
        for unit, params in enumerate(fsdp._unit_params):
            for p, full in zip(params, engine.full_parameters(unit), strict=True):
                for name in names[id(p)]:
                    state[name] = full
    else:
        meta = {"world_size": None, "units": []}
        for unit, params in enumerate(fsdp._unit_params):
            pieces = [v.detach().clone() for v in engine.shard_views(unit)]
            meta["world_size"] = engine.shard_size(unit)
            meta["units"].append(
                {
                    "rank": engine.shard_rank(unit),
                    "names": [names[id(p)][0] for p in params],
                    "numels": [len(pieces_i) for pieces_i in pieces],
                }
            )
            if kind == "sharded_state_dict":
                for p, piece in zip(params, pieces, strict=True):
                    state[names[id(p)][0]] = piece
            else:
                state[f"{META}.unit{unit}.flat"] = torch.cat(pieces) if pieces else torch.empty(0)
        state[META] = meta
    for name, buffer in persistent_buffers(fsdp.module).items():
        state[name] = buffer.detach().clone()
    return state


def load(fsdp, state: dict, kind: str, strict: bool = True):
    engine, names = fsdp._engine, fsdp._names
    missing, used = [], set()
    if kind == "full_state_dict":
        for unit, params in enumerate(fsdp._unit_params):
            tensors = []
            for p in params:
                name = next((n for n in names[id(p)] if n in state), None)
                if name is None:
                    missing.append(names[id(p)][0])
                    continue
                used.update(n for n in names[id(p)] if n in state)
                tensors.append(state[name])
            if len(tensors) == len(params):
                engine.load_full_parameters(unit, tensors)
    else:
        meta = state.get(META)
        if meta is None:
            raise ValueError(
                f"{kind}: the state dict has no {META!r} entry; it was not saved as a "
                f"{kind} of a shardwise FSDP model (load a full_state_dict instead)"
            )
        used.add(META)
        for unit, params in enumerate(fsdp._unit_params):
            if engine.shard_size(unit) != meta["world_size"]:
                raise ValueError(
                    f"{kind} was saved with {meta['world_size']} shards but this model has "
                    f"{engine.shard_size(unit)}; save a full_state_dict to change the world size"
                )
            views = engine.shard_views(unit)
            if kind == "sharded_state_dict":
                pieces = []
                for p in params:
                    name = names[id(p)][0]
                    used.add(name)
                    pieces.append(state[name])
            else:
                key = f"{META}.unit{unit}.flat"
                used.add(key)
                pieces = list(torch.split(state[key], [v.numel() for v in views]))
            with torch.no_grad():
                for view, piece in zip(views, pieces, strict=True):
                    view.copy_(piece.reshape(view.shape))
    buffers = persistent_buffers(fsdp.module)
    with torch.no_grad():
        for name, buffer in buffers.items():
            if name in state:
                buffer.copy_(state[name])
                used.add(name)
            else:
                missing.append(name)
    unexpected = [k for k in state if k not in used]
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"Error(s) loading the {kind}: missing keys {missing}, unexpected keys {unexpected}"
        )
    return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)
