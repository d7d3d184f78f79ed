"""Crash-safe training checkpoints for ``shardwise-train``.

Layout::

    directory/step-00000100/rank-00000.pt   one file per rank (its shard of model/optimizer/
    directory/step-00000100/rank-00001.pt   data-stream state), written by that rank
    directory/step-00000100/manifest.json   written LAST by rank 0: step, world size, every
                                            file's size and SHA-256, the run's config text

Every file is written atomically: to a temporary file in the same directory, flushed and
``fsync``-ed, then ``os.replace``-d onto its name (and the directory is fsync-ed), so a reader
sees either the old file or the complete new one, and a failed write leaves no temporary file
behind (``shardwise.atomic_file``, which the ZeRO engine's optimizer pieces use too).

A checkpoint is complete only when its manifest exists: rank 0 writes it after a barrier
(a callable the caller supplies; by default ``torch.distributed.barrier`` when a process group
is initialized, else nothing), so a crash mid-save leaves a directory without manifest, which
``latest`` skips. ``latest`` also re-hashes every file and skips (with a ``CheckpointWarning``
naming the file and the reason) a checkpoint whose files are missing, truncated or corrupted,
falling back to the newest good one. After the manifest, rank 0 prunes older step directories
so that ``keep_last`` complete checkpoints remain; it never deletes the one just written nor
anything newer than it.

The folder's rules (the manifest's hashes, ``verify``, ``latest``, ``prune``) are C++
(``checkpoint/checkpoint_dir.h``), shared with LibTorch trainers; this module adapts them.

Payloads are loaded with ``torch.load(weights_only=True)``, so ``save`` checks up front that a
payload contains only tensors, dicts, lists, tuples, ints, floats, strings, bools and None
(plus ``torch.dtype``/``torch.device``), naming the offending key instead of producing a
checkpoint that cannot be loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import torch

from ..atomic_file import atomic_write, atomic_write_path

MANIFEST = "manifest.json"
SHARDED_EXPORT = "model-sharded"  # the trainer's export under fsdp_state_dict_type sharded / local
_SCALARS = (bool, int, float, str, type(None), torch.dtype, torch.device)


class CheckpointWarning(UserWarning):
    """A checkpoint directory was skipped (incomplete or corrupt)."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def check_payload(obj, where: str = "payload") -> None:
    """Raises ``TypeError`` naming the first value ``torch.load(weights_only=True)`` rejects."""
    if isinstance(obj, torch.Tensor) or isinstance(obj, _SCALARS):
        return
    if type(obj) in (dict, OrderedDict):
        for key, value in obj.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{where}: key {key!r} is not a str or int")
            check_payload(value, f"{where}[{key!r}]")
        return
    if type(obj) in (list, tuple, torch.Size):
        for i, value in enumerate(obj):
            check_payload(value, f"{where}[{i}]")
        return
    raise TypeError(f"{where}: {type(obj).__name__} cannot be loaded with weights_only=True")


def _default_barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _default_gather(record) -> list:
    """Every rank's ``record`` over the default group (a barrier too); one process: its own."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        records: list = [None] * dist.get_world_size()
        dist.all_gather_object(records, record)
        return records
    return [record]


def save(
    directory: str | Path,
    step: int,
    payload_per_rank: dict,
    rank: int,
    world: int,
    config_yaml: str,
    keep_last: int | None = 3,
    barrier: Callable[[], None] | None = None,
    gather: Callable[[object], list] | None = None,
) -> Path:
    """Saves this rank's ``payload_per_rank`` as checkpoint ``step``; returns its directory.

    Every rank calls this. Each rank hashes its own file, and ``gather`` (default:
    ``all_gather_object`` over the default group if initialized, else this rank's alone) hands
    rank 0 every rank's record once all files exist; rank 0 writes the manifest from them
    (hashing itself any file not reported) and prunes, then ``barrier`` (default:
    ``torch.distributed.barrier`` if initialized, else a no-op) lets ``save`` return
    everywhere only once the checkpoint is complete. Simulating ranks in one process: save the
    highest rank first and rank 0 last. ``keep_last=None`` keeps every checkpoint.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside [0, {world})")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    check_payload(payload_per_rank)
    barrier = barrier or _default_barrier
    step_dir = Path(directory) / step_dir_name(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # re-saving a step (after resuming from an earlier one): invalidate it first
        with contextlib.suppress(FileNotFoundError):
            os.unlink(step_dir / MANIFEST)
    from .. import _C

    mine = step_dir / rank_file_name(rank)
    atomic_write(mine, lambda f: torch.save(payload_per_rank, f))
    records = (gather or _default_gather)((rank, *_C.checkpoint_file_record(str(mine))))
    if rank == 0:
        reported = {rank_file_name(r): (size, sha) for r, size, sha in records}
        _C.checkpoint_write_manifest(str(step_dir), step, world, config_yaml, reported)
        if keep_last is not None:
            prune(directory, keep_last, newest_step=step)
    barrier()
    return step_dir


def prune(directory: str | Path, keep_last: int, newest_step: int) -> list[Path]:
    """Deletes step directories older than ``newest_step`` beyond the ``keep_last`` newest
    complete (manifest present) ones, including incomplete leftovers; returns what it deleted.
    ``newest_step`` itself and anything newer are never touched (C++ prune)."""
    from .. import _C

    return [Path(p) for p in _C.checkpoint_prune(str(directory), keep_last, newest_step)]


def remove_temporary_files(directory: str | Path) -> list[Path]:
    """Deletes what writes killed mid-way left under ``directory`` and its step folders (their
    temporary files; the checkpoints themselves are untouched); returns what it deleted. Only
    while no rank writes: ``shardwise-train`` calls it on rank 0 before it resumes (C++)."""
    from .. import _C

    return [Path(p) for p in _C.checkpoint_remove_temporary_files(str(directory))]


def agree(
    directory: str | Path, rank: int, world_size: int, broadcast_step
) -> tuple[Path | None, list[Path], list[str]]:
    """The checkpoint every rank resumes from (collective; C++ ``agree_on_checkpoint``): rank 0
    removes killed writes' temporary files, picks the newest intact checkpoint and hands its
    step to ``broadcast_step(step) -> rank 0's step`` (-1: none); ranks choosing alone could
    disagree. Returns (the step folder or None, the files removed, the newer checkpoints skipped
    with reasons); the last two only on rank 0. ``broadcast_step`` may be None at world size 1."""
    from .. import _C

    path, removed, skipped = _C.checkpoint_agree(str(directory), rank, world_size, broadcast_step)
    return (Path(path) if path is not None else None), [Path(p) for p in removed], skipped


def verify(step_dir: str | Path) -> str | None:
    """None if ``step_dir`` is a complete, intact checkpoint, else the reason it is not (C++
    verify: the manifest, one file per rank, sizes and SHA-256)."""
    from .. import _C

    return _C.checkpoint_verify(str(step_dir)) or None


def latest(directory: str | Path) -> Path | None:
    """The newest intact checkpoint directory under ``directory``, or None. Newer incomplete or
    corrupt ones are skipped with a ``CheckpointWarning`` naming the file and the reason."""
    from .. import _C

    found, skipped = _C.checkpoint_latest(str(directory))
    for reason in skipped:
        warnings.warn(reason, CheckpointWarning, stacklevel=2)
    return Path(found) if found is not None else None


def read_manifest(step_dir: str | Path) -> dict:
    """The manifest of a checkpoint (step, world_size, files, config_yaml)."""
    return json.loads((Path(step_dir) / MANIFEST).read_text("utf-8"))


def _libtorch_type_tags() -> list:
    """The functions LibTorch's pickler (``torch::pickle_save``, the C++ trainer's rank files)
    names to tag containers with their static type; each returns its argument unchanged."""
    from torch.jit import _pickle

    return [
        _pickle.restore_type_tag,
        _pickle.build_intlist,
        _pickle.build_doublelist,
        _pickle.build_boollist,
        _pickle.build_tensorlist,
    ]


def load(path: str | Path, rank: int, map_location="cpu"):
    """This rank's payload from checkpoint directory ``path``, via
    ``torch.load(weights_only=True)``; files written by LibTorch (the C++ trainer) load too: their
    type tags, identity functions, are the only globals added."""
    with torch.serialization.safe_globals(_libtorch_type_tags()):
        return torch.load(
            Path(path) / rank_file_name(rank), map_location=map_location, weights_only=True
        )


def load_sharded_model(directory: str | Path, model: torch.nn.Module) -> Path:
    """Fills ``model``'s parameters (the plain GPT's names) from a sharded export
    (``SHARDED_EXPORT``, written by any world size): the newest intact step in ``directory``,
    every rank's pieces, every element covered or a ValueError naming the tensor. Returns the
    step directory read."""
    from .. import pieces

    step_dir = latest(directory)
    if step_dir is None:
        raise FileNotFoundError(f"{directory}: no intact sharded export (manifest and rank files)")
    world = int(read_manifest(step_dir)["world_size"])
    saved = [p for r in range(world) for p in load(step_dir, r)["pieces"]]
    slots = [pieces.Slot(n, 0, p.detach().view(-1)) for n, p in model.named_parameters()]
    with torch.no_grad():
        pieces.fill(slots, saved)
    return step_dir


def _unshared(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, no two sharing a storage: a tensor whose storage was already seen
    (a tied weight, a view) is cloned; the first of each storage is kept without copying."""
    seen, out = set(), {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().to("cpu")
        key = tensor.untyped_storage().data_ptr()
        if key in seen or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()
        seen.add(tensor.untyped_storage().data_ptr())
        out[name] = tensor
    return out


def export_safetensors(
    state_dict: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Writes a full (unsharded) state dict as one safetensors file, atomically; tied weights
    and views are written as independent tensors instead of failing in safetensors."""
    from safetensors.torch import save_file

    tensors = _unshared(state_dict)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_path(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


class SigtermFlag:
    """``requested`` becomes True when one of ``signals`` arrives; the training loop checks it
    at step boundaries, saves a checkpoint and exits (a second SIGINT, Ctrl-C pressed again,
    interrupts at once). ``close()`` restores the old handlers."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)):
        self.requested = False
        self.signum: int | None = None
        self._previous = {}
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:  # a second Ctrl-C: stop now
            self.close()
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum

    def close(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def __enter__(self) -> SigtermFlag:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def install_sigterm_handler(signals: tuple[int, ...] = (signal.SIGTERM,)) -> SigtermFlag:
    """Installs a flag-setting handler (main thread only); see ``SigtermFlag``."""
    return SigtermFlag(signals)
