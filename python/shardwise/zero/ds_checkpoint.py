"""DeepSpeed's checkpoint calls on the ZeRO engine (``engine.save_checkpoint`` /
``engine.load_checkpoint``), with DeepSpeed's directory contract: ``save_dir/<tag>/`` holds one
checkpoint (tag default ``global_step<N>``) and ``save_dir/latest`` names the newest tag, which
``load_checkpoint(load_dir)`` reads when no tag is given ((None, None) when there is none, as in
DeepSpeed).

Inside a tag: ``mp_rank_00_model_states.pt`` (written by rank 0), a dict as DeepSpeed's: the full
model under ``"module"`` (in the module's dtype) beside the client state's keys and
``global_steps``; and ``zero_rank<r>.pt`` (each rank's optimizer pieces: master weights, moments,
step, loss scaler, scheduler, world-size independent, so a checkpoint loads at any world size).
``load_checkpoint`` returns the model file's path and that dict without ``"module"``, as
DeepSpeed does. Every file is read back with ``torch.load(weights_only=True)``: client state may
hold tensors, numbers, strings, lists and dicts, and anything else is refused before a file is
written.

Nothing is lost to a crash: the ranks write into ``.<tag>.tmp``; rank 0 then moves an existing
``<tag>`` aside, renames the new folder into place, removes the old one, and only then rewrites
``latest`` (atomically). A save cut short leaves the previous checkpoint and ``latest`` intact.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from ..atomic_file import atomic_write

LATEST = "latest"
MODEL = "mp_rank_00_model_states.pt"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _check_client_state(client_state: Mapping) -> None:
    if not isinstance(client_state, Mapping):
        raise TypeError(
            f"save_checkpoint: client_state must be a dict, not {type(client_state).__name__}"
        )
    buffer = io.BytesIO()
    try:
        torch.save(dict(client_state), buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception as error:  # what the safe loader refuses would not load back
        raise ValueError(
            "save_checkpoint: client_state must hold only tensors, numbers, strings, lists and "
            f"dicts (it is loaded back without unpickling code): {error}"
        ) from None


def save_checkpoint(engine, save_dir, tag=None, client_state=None, save_latest=True) -> None:
    """Every rank calls it (DeepSpeed's rule): see the module docstring."""
    if not save_dir:
        raise ValueError(f"save_checkpoint: save_dir must be a non-empty path, got {save_dir!r}")
    client_state = {} if client_state is None else client_state
    _check_client_state(client_state)
    tag = str(tag if tag is not None else f"global_step{engine.global_steps}")
    if "/" in tag or tag in ("", ".", "..", LATEST):
        raise ValueError(f"save_checkpoint: tag {tag!r} must be a plain folder name")
    root = Path(save_dir)
    temporary, final = root / f".{tag}.tmp", root / tag
    model = engine.module.state_dict()  # stage 3: gathered on every rank
    if _rank() == 0:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
    _barrier()
    engine.save_optimizer_checkpoint(temporary)
    if _rank() == 0:
        state = {**client_state, "global_steps": engine.global_steps, "module": model}
        atomic_write(temporary / MODEL, lambda f: torch.save(state, f))
    _barrier()
    if _rank() == 0:
        old = root / f".{tag}.old"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        temporary.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        if save_latest:
            atomic_write(root / LATEST, lambda f: f.write(tag.encode()))
    _barrier()


def load_checkpoint(
    engine,
    load_dir,
    tag=None,
    load_module_strict=True,
    load_optimizer_states=True,
    load_lr_scheduler_states=True,
    load_module_only=False,
):
    """(the model file loaded, client_state), or (None, None) without a ``latest`` file."""
    if load_module_only or not load_optimizer_states:
        raise ValueError(
            "load_checkpoint: loading the model without the optimizer state is not supported "
            "(the ZeRO optimizer's master weights would go stale); load the model_states.pt "
            "into a fresh model and build a new engine from it"
        )
    root = Path(load_dir)
    if tag is None:
        latest = root / LATEST
        if not latest.is_file():
            return None, None
        tag = latest.read_text().strip()
    path = root / str(tag)
    if not (path / MODEL).is_file():
        raise FileNotFoundError(
            f"load_checkpoint: {path / MODEL} is missing; {path} is not a complete checkpoint "
            "(pass the tag of one save_checkpoint wrote)"
        )
    state = torch.load(path / MODEL, weights_only=True, map_location="cpu")
    engine.module.load_state_dict(state.pop("module"), strict=load_module_strict)
    engine.load_optimizer_checkpoint(path, scheduler=load_lr_scheduler_states)
    return str(path / MODEL), state
