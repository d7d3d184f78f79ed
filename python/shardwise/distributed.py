"""Registers the ``shardwise`` torch.distributed backend (imported by ``import shardwise``).

Use it like any backend: ``dist.init_process_group("shardwise")``, or
``"cpu:shardwise,cuda:nccl"`` to send CUDA tensors to NCCL, in ``dist.new_group(backend=...)``
and under ``torchrun``. The environment variable ``SHARDWISE_RING_BYTES`` sets the size of the
shared-memory ring between each pair of ranks (default 1 MiB, the fastest measured here);
``SHARDWISE_SPIN_US`` how long a waiting rank polls shared memory before it sleeps (default: 50
when this host's ranks do not outnumber its cores, else 0; polling is what makes small messages
fast, sleeping what lets ranks share cores); ``SHARDWISE_SINGLE_COPY_BYTES`` the message size from
which a rank reads a peer's data straight from its memory (process_vm_readv) instead of through
the ring (default 0, off: slower on the virtual machines measured, see the benchmark results).
"""

import datetime
import os

import torch.distributed as dist

from . import _C

NAME = "shardwise"


def _create_backend(store, rank, world_size, timeout):
    if isinstance(timeout, (int, float)):
        timeout = datetime.timedelta(seconds=timeout)
    ring_bytes = _int_env("SHARDWISE_RING_BYTES", 0)
    spin_us = _int_env("SHARDWISE_SPIN_US", -1)
    single_copy = _int_env("SHARDWISE_SINGLE_COPY_BYTES", 0)
    return _C._create_backend(store, rank, world_size, timeout, ring_bytes, spin_us, single_copy)


def _int_env(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = -2
    if value < -1 or (value == -1 and default != -1):
        raise ValueError(f"{name}={text!r} is not a valid size; unset it or give a number >= 0")
    return value


def register() -> None:
    """Registers the backend once; safe to call again."""
    if dist.is_available() and NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create_backend, devices=["cpu", "cuda"])


register()
