"""PyTorch's own distributed test suite (the gated copy ``gate.py`` writes) against the backend
named by ``BACKEND`` (shardwise or gloo), as torch's ``test/distributed/test_distributed_spawn.py``
runs it: every test spawns ``WORLD_SIZE`` ranks. ``run.py`` runs it for both backends and
compares. Needs ``SHARDWISE_GATED_DIR``: the folder ``gate.py`` wrote."""

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
