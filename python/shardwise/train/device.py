"""Where ``shardwise-train`` runs: ``training.device`` (``auto|cpu|cuda``) resolved against the
machine, the process-group backend each device gets by default, and what the loop needs on that
device (this rank's device, batches moved there, GPU memory and the bf16 peak for MFU).

Rules, checked at validation before anything starts:

- ``auto`` is ``cuda`` when ``torch.cuda.device_count() > 0``, else ``cpu``;
- ``cuda`` on a machine without a CUDA GPU is refused, naming ``training.device`` and the fix;
- the default backend is ``shardwise`` on CPU and ``cpu:shardwise,cuda:nccl`` on GPUs (the
  shardwise backend for CPU tensors, NCCL for CUDA ones), except when a node runs more processes
  than it has GPUs: then ``shardwise`` for both, which stages CUDA tensors through host memory
  when ranks share a GPU (``SHARDWISE_CUDA_COMM``, backend/host_staged_comm.hpp), and rank
  LOCAL_RANK uses GPU ``LOCAL_RANK % GPUs``;
- a backend that uses NCCL is refused on CPU, and on GPUs when a node runs more processes than it
  has GPUs (NCCL refuses two ranks on one device).

On CPU machines the CUDA branches are checked by the rules above and by unit tests of the pure
parts (the peak table, the backend strings); ``make test-gpu`` runs them on a GPU.
"""

from __future__ import annotations

import os

import torch

BACKENDS = ("shardwise", "gloo", "nccl", "mpi")
DEVICES = ("auto", "cpu", "cuda")

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, by a substring of
# torch.cuda.get_device_name(); the first match wins, so longer names come first.
BF16_PEAKS = (
    ("H200", 989.4e12),
    ("H100 PCIe", 756.5e12),
    ("H100", 989.4e12),
    ("A100", 312e12),
    ("L40S", 362.05e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
)


def resolve_device(requested: str, cuda_devices: int) -> str:
    """``cpu`` or ``cuda`` for ``training.device``; ValueError naming the key and the fix."""
    if requested not in DEVICES:
        raise ValueError(f"training.device {requested!r}: use one of {', '.join(DEVICES)}")
    if requested == "auto":
        return "cuda" if cuda_devices > 0 else "cpu"
    if requested == "cuda" and cuda_devices == 0:
        raise ValueError(
            "training.device: cuda, but this machine has no CUDA GPU "
            "(torch.cuda.device_count() == 0); set training.device: cpu (or auto)"
        )
    return requested


def default_backend(device: str, cuda_devices: int = 1, processes_per_node: int = 1) -> str:
    if device == "cpu" or processes_per_node > cuda_devices:
        return "shardwise"
    return "cpu:shardwise,cuda:nccl"


def backend_parts(backend: str) -> dict[str, str]:
    """``{device: backend}`` of a backend string (``nccl`` or ``cpu:shardwise,cuda:nccl``); a
    bare name serves every device (``*``). ValueError naming ``distributed.backend``."""
    parts = {}
    for item in backend.split(","):
        device, _, name = item.strip().rpartition(":")
        device = device or "*"
        if name not in BACKENDS or device not in ("*", "cpu", "cuda") or device in parts:
            names = ", ".join(map(repr, BACKENDS))
            raise ValueError(
                f"distributed.backend {backend!r}: use one of {names}, or a device:backend list "
                "such as cpu:shardwise,cuda:nccl"
            )
        parts[device] = name
    return parts


def check_backend(backend: str, device: str, cuda_devices: int, processes_per_node: int) -> None:
    """The NCCL rules of the module docstring; ValueError naming the key and the fix."""
    if "nccl" not in backend_parts(backend).values():
        return
    if device == "cpu":
        raise ValueError(
            f"distributed.backend {backend!r} uses NCCL, which needs CUDA GPUs, and "
            "training.device is cpu; use backend: shardwise (or gloo), or train on cuda"
        )
    if processes_per_node > cuda_devices:
        raise ValueError(
            f"distributed.backend {backend!r} uses NCCL, which cannot run two ranks on one GPU: "
            f"{processes_per_node} processes per node on {cuda_devices} GPU(s); launch at most "
            f"{cuda_devices} per node (torchrun --nproc_per_node={cuda_devices}), or use "
            "backend: shardwise, which stages CUDA tensors through host memory when ranks share "
            "a GPU"
        )


def local_device(device: str, local_rank: int) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK % GPUs`` (made current, as NCCL needs) or the
    CPU."""
    if device == "cpu":
        return torch.device("cpu")
    index = local_rank % max(torch.cuda.device_count(), 1)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def to_device(batch: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The batch on ``device``: unchanged on the CPU; on a GPU copied from pinned memory without
    blocking (the copy overlaps the host's next work)."""
    if device.type == "cpu":
        return batch
    return tuple(t.pin_memory().to(device, non_blocking=True) for t in batch)


def bf16_peak(device_name: str) -> float | None:
    """The data-sheet dense bf16 peak of a GPU by its name, or None for one not listed."""
    for key, peak in BF16_PEAKS:
        if key in device_name:
            return peak
    return None


def gpu_memory_mb(device: torch.device) -> list[float]:
    """[allocated, reserved, peak allocated] MiB on this rank's GPU; [] on the CPU."""
    if device.type != "cuda":
        return []
    return [
        torch.cuda.memory_allocated(device) / 2**20,
        torch.cuda.memory_reserved(device) / 2**20,
        torch.cuda.max_memory_allocated(device) / 2**20,
    ]


def device_memory_bytes(local_world: int, device: str = "cpu") -> int:
    """The memory one rank trains in: on ``cuda`` its GPU's, on the CPU this host's memory
    shared by its ranks."""
    if device == "cuda":
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, local_world)


def host_cores() -> int:
    """The cores this process may run on: its affinity mask (``taskset``, a container's cpuset),
    which ``os.cpu_count`` ignores; the machine's count where the mask cannot be read."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_threads_per_rank(
    local_ranks: int, deterministic: bool = False, cores: int | None = None
) -> int:
    """The threads a CPU rank computes with: its host's ``cores`` (default: this process's,
    ``host_cores``) shared by its ``local_ranks`` ranks (at least one each); one in
    deterministic mode (a BLAS may split a reduction over its threads)."""
    return 1 if deterministic else max(1, (cores or host_cores()) // local_ranks)
