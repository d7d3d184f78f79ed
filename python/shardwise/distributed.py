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
virtual machines measured, see the benchmark results); ``SHARDWISE_HIERARCHICAL=0`` keeps
all-reduce, reduce-scatter and all-gather flat across hosts (default 1: within each host and
between the ranks of one place on every host); ``SHARDWISE_HOST_ID`` names this process's host
in place of its host name (as ``NCCL_HOSTID``; ranks that share one must share memory).
"""

import datetime
import os

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


def launch_store(timeout: datetime.timedelta | None = None) -> dist.Store | None:
    """Under torchrun, a store of this launch's own for ``init_process_group``; None otherwise.

    torchrun's workers reach the agent's TCPStore (``TORCHELASTIC_USE_AGENT_STORE``), and after
    ``--max-restarts`` restarts them they find it still holding the keys of the failed launch:
    torch's ``env://`` rendezvous adds no prefix of its own since it shared the rendezvous
    store (pytorch/pytorch#135712), so gloo, NCCL and shardwise read the dead ranks'
    addresses. The keys go under ``shardwise/launch_N/``, N this launch's number:
    - on one node, the agent's ``TORCHELASTIC_RESTART_COUNT``;
    - across nodes each agent counts only its own restarts, so each rank counts its launches
      on the store (``shardwise/launches/rank_R``); every restart starts every rank once, so
      the counts agree unless a rank ended before it reached its process group.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    kwargs = {} if timeout is None else {"timeout": timeout}
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False, **kwargs
    )
    if os.environ.get("GROUP_WORLD_SIZE", "1") == "1":
        launch = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    else:
        launch = base.add(f"shardwise/launches/rank_{rank}", 1)
    return dist.PrefixStore(f"shardwise/launch_{launch}", base)


def init_process_group(backend: str, timeout: datetime.timedelta | None = None) -> None:
    """``dist.init_process_group(backend)`` from the launcher's environment, on
    ``launch_store``'s store under torchrun, so that a restarted job connects afresh."""
    store = launch_store(timeout)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)


register()
