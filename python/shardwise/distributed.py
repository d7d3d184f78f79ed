"""Registers the ``shardwise`` torch.distributed backend (imported by ``import shardwise``).

Use it like any backend: ``dist.init_process_group("shardwise")``, or
``"cpu:shardwise,cuda:nccl"`` to send CUDA tensors to NCCL, in ``dist.new_group(backend=...)``
and under ``torchrun``. The environment variable ``SHARDWISE_RING_BYTES`` sets the size of the
shared-memory ring between each pair of ranks (default 1 MiB, the fastest measured here);
``SHARDWISE_SPIN_US`` how long a waiting rank polls shared memory before it sleeps (default: 1000
when this host's ranks do not outnumber its cores, else 0: ``common/spin_wait.h``; polling is
what makes small messages fast, sleeping what lets ranks share cores);
``SHARDWISE_SINGLE_COPY_BYTES`` the message size from which a rank reads a peer's data straight
from its memory (process_vm_readv) instead of through the ring (default 0, off: slower on the
virtual machines measured, see the benchmark results).
"""

import datetime

import torch.distributed as dist

from . import _C

NAME = "shardwise"


def _create_backend(store, rank, world_size, timeout):
    """The backend for torch.distributed; the SHARDWISE_* variables are read in C++
    (``distributed/process_group.h``), as LibTorch programs read them."""
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    return _C._create_backend(store, rank, world_size, timeout)


def register() -> None:
    """Registers the backend once; safe to call again."""
    if dist.is_available() and NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create_backend, devices=["cpu", "cuda"])


register()
