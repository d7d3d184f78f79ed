"""PyTorch's own distributed test suite (the gated copy ``gate.py`` writes) against the backend
named by ``BACKEND`` (shardwise or gloo), as torch's ``test/distributed/test_distributed_spawn.py``
runs it: every test spawns ``WORLD_SIZE`` ranks. ``run.py`` runs it for both backends and
compares. Needs ``SHARDWISE_GATED_DIR``: the folder ``gate.py`` wrote. With
``SHARDWISE_CONFORMANCE_HOSTS=K`` the ranks run as if on K hosts (rank r on host r K / world,
named through the backend's ``SHARDWISE_HOST_ID``): TCP between hosts, shared memory within, and
the hierarchical collectives wherever a group spans hosts evenly."""

import os
import sys

import shardwise  # noqa: F401  (registers the backend in every spawned rank)
from torch.testing._internal.common_distributed import DistTestCases

for feature, backends in DistTestCases.backend_feature.items():  # every set gloo is in
    if "gloo" in backends or feature == "plugin":
        backends.add("shardwise")

sys.path.insert(0, os.environ["SHARDWISE_GATED_DIR"])
from shardwise_distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, **kwargs):
        hosts = int(os.environ.get("SHARDWISE_CONFORMANCE_HOSTS", "0"))
        if hosts:  # each spawned rank, before torch's _run makes its group
            world = int(os.environ["WORLD_SIZE"])
            os.environ["SHARDWISE_HOST_ID"] = f"conformance-host{rank * hosts // world}"
        super()._run(rank, test_name, file_name, pipe, **kwargs)
