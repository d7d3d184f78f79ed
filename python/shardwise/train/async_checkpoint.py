"""Asynchronous checkpoints (``training.checkpoint.async: true``): the step is blocked only
while the state is copied to host memory; a background writer then saves it with the run's own
writer (``checkpoint.save``: each rank's file written to a temporary name, fsynced and renamed,
the manifest with every file's size and SHA-256 written last by rank 0, then the pruning), while
training goes on.

- **One save in flight.** ``save`` first waits for the previous save to finish (a second save
  waits, so at most one copy of the state is held besides the live one), then copies and
  starts the writer.
- **Its own process group.** The writer's two collectives (every rank's file record gathered
  once all files exist; the barrier after the manifest) run over a CPU group made for it at
  start (the shardwise backend, whose errors name a dead rank, under a run on it; else gloo),
  so they never interleave with the training's collectives on the other groups.
- **Nothing lost.** A save is complete only once its manifest exists, and older checkpoints are
  pruned only after that; a crash or kill mid-write leaves the previous complete checkpoint,
  which resuming finds (``checkpoint.agree``) as after a synchronous save.
- **Waited for.** ``wait`` joins the writer and raises what it raised, naming the step; the
  trainer waits before the next save, at the end of the run, and on SIGTERM or SIGINT (after
  the last save it starts), so a run never exits with a save half written.

The copy (``HostStaging``): every tensor of the payload copied to the CPU, into buffers kept
from the previous save (pinned when the tensor is on a GPU: ``non_blocking`` copies, then one
synchronize), so the live state can change under the writer."""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint as ckpt


class HostStaging:
    """Host copies of a payload's tensors, in buffers kept from one save to the next: the
    state's shapes repeat, so after the first save a copy writes into memory already mapped
    (no page faults) and, from a GPU, already pinned. Only reused once the writer is done with
    them (``AsyncSaver.save`` waits first)."""

    def __init__(self):
        self._buffers: list[torch.Tensor] = []
        self._next: list[torch.Tensor] = []

    def copy(self, obj):
        """``obj`` with every tensor copied to the CPU (pinned when copied from a GPU)."""
        self._next = []
        out = self._copy(obj)
        self._buffers = self._next
        return out

    def _buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        i = len(self._next)
        old = self._buffers[i] if i < len(self._buffers) else None
        if old is None or old.shape != tensor.shape or old.dtype != tensor.dtype:
            pinned = tensor.device.type == "cuda"
            old = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
        self._next.append(old)
        return old

    def _copy(self, obj):
        if isinstance(obj, torch.Tensor):
            tensor = obj.detach()
            return self._buffer(tensor).copy_(tensor, non_blocking=tensor.device.type == "cuda")
        if isinstance(obj, dict):
            return {k: self._copy(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self._copy(v) for v in obj)
        return obj


class AsyncSaver:
    """The background writer of one run (module docstring). Collective: every rank makes one,
    at the same point (it makes the writer's process group)."""

    def __init__(self, timeout_s: float | None = None):
        """``timeout_s``: the writer's barriers give up after it (a dead rank; None: torch's
        default), as the run's own collectives do."""
        timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        group = None
        if dist.is_initialized():  # the shardwise backend names a dead peer; else gloo (CPU)
            backend = "shardwise" if "shardwise" in str(dist.get_backend()) else "gloo"
            group = dist.new_group(backend=backend, timeout=timeout)
        self.group = group
        self._staging = HostStaging()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._step: int | None = None
        self.blocked_s = 0.0  # the last save's time in the caller: the wait and the copy

    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def _gather(self, record) -> list:
        if self.group is None:
            return [record]
        records: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(records, record, group=self.group)
        return records

    def save(self, directory: Path, step: int, payload: dict, rank: int, world: int,
             config_yaml: str, keep_last: int | None) -> Path:  # fmt: skip
        """Starts saving ``payload`` as checkpoint ``step`` (after the previous save ended);
        returns the folder it will complete."""
        start = time.perf_counter()
        self.wait()
        ckpt.check_payload(payload)  # a bad payload fails here, in the caller
        host = self._staging.copy(payload)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the non_blocking copies have landed
        self._step, self._error = step, None

        def write() -> None:
            try:
                ckpt.save(directory, step, host, rank, world, config_yaml, keep_last,
                          barrier=self._barrier, gather=self._gather)  # fmt: skip
            except BaseException as error:  # raised again by wait(), in the caller
                self._error = error

        self._thread = threading.Thread(target=write, name=f"checkpoint-{step}", daemon=False)
        self._thread.start()
        self.blocked_s = time.perf_counter() - start
        return Path(directory) / ckpt.step_dir_name(step)

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Until the save in flight is complete; its error, if it had one, is raised here."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(
                f"the asynchronous save of step {self._step} failed: {error}"
            ) from error
