"""The GPU suite (``make test-gpu``): skipped as a whole without a CUDA device. One process
group for the session, world 1, over the shardwise backend (CUDA tensors through its NCCL
communicator); the engines' multi-rank checks run on CPU in tests/distributed."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

if not torch.cuda.is_available():
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def group():
    import shardwise  # noqa: F401  (registers the backend)
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("cpu:shardwise,cuda:shardwise", store=store, rank=0, world_size=1)
    torch.cuda.set_device(0)
    yield dist.group.WORLD
    dist.destroy_process_group()
