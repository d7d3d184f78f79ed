"""``training.checkpoint.verify_at_start``: before step 1, the state is saved where the run's
checkpoints go and loaded back, so a checkpoint path that cannot be written, a payload that does
not load, or one that loads altered fails the run in seconds rather than at its first save,
hours in.

Every rank saves its payload with the run's own writer (``checkpoint.save``: atomic files, the
manifest and its hashes) into ``<checkpoints>/.verify-at-start``, checks the written checkpoint
(``checkpoint.verify``: manifest, sizes, SHA-256), loads its own file back
(``checkpoint.load``, ``weights_only``) and compares it with what it saved, bit for bit. The
folder is removed after every rank has compared. A difference raises ``CheckpointVerifyError``
naming the rank and the first entry that differs."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint as ckpt

FOLDER = ".verify-at-start"  # not a step-* folder: resuming never reads it


class CheckpointVerifyError(RuntimeError):
    """The start-of-run round trip did not give back what was saved."""


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def first_difference(saved, loaded, where: str = "payload") -> str | None:
    """Where ``loaded`` first differs from ``saved`` (tensors: dtype, shape and every bit)."""
    if isinstance(saved, torch.Tensor):
        if not isinstance(loaded, torch.Tensor):
            return f"{where}: a tensor came back as {type(loaded).__name__}"
        saved = saved.detach().cpu()
        if saved.dtype != loaded.dtype or saved.shape != loaded.shape:
            return (
                f"{where}: {saved.dtype}{list(saved.shape)} came back as "
                f"{loaded.dtype}{list(loaded.shape)}"
            )
        same = torch.equal(_bits(saved), _bits(loaded))
        return None if same else f"{where}: the values differ"
    if isinstance(saved, dict):
        if not isinstance(loaded, dict) or saved.keys() != loaded.keys():
            return f"{where}: the keys differ"
        for key in saved:
            found = first_difference(saved[key], loaded[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(saved, list | tuple):
        if not isinstance(loaded, list | tuple) or len(saved) != len(loaded):
            return f"{where}: the lengths differ"
        for i, (a, b) in enumerate(zip(saved, loaded, strict=True)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if saved == loaded else f"{where}: {saved!r} came back as {loaded!r}"


def round_trip(directory: Path, step: int, payload: dict, rank: int, world: int,
               config_yaml: str, device: torch.device) -> float:  # fmt: skip
    """Saves ``payload`` under ``directory``/FOLDER, checks and loads it back on every rank;
    returns the seconds it took (collective; ``device``: where the group reduces a flag)."""
    start = time.perf_counter()
    where = Path(directory) / FOLDER
    step_dir = ckpt.save(where, step, payload, rank, world, config_yaml, keep_last=None)
    problem = ckpt.verify(step_dir)
    difference = problem or first_difference(payload, ckpt.load(step_dir, rank))
    failed = torch.tensor([0 if difference is None else 1], device=device)
    if dist.is_initialized():
        dist.all_reduce(failed)  # every rank stops, not only the one that found it
    if rank == 0:
        shutil.rmtree(where, ignore_errors=True)
    if difference is not None:
        raise CheckpointVerifyError(
            f"rank {rank}: the checkpoint saved at the start under {where} did not load back as "
            f"saved: {difference}"
        )
    if int(failed.item()):
        raise CheckpointVerifyError(
            f"rank {rank}: another rank's start-of-run checkpoint did not load back as saved "
            f"(its error names it); checkpoints under {directory} are not to be trusted"
        )
    return time.perf_counter() - start
