"""shardwise.accelerate.Accelerator refuses what shardwise does not run, naming the key and the
fix, before any training: several DeepSpeed plugins, an optimizer whose parameter groups differ
under DeepSpeed, FSDP's ignored_modules (version 1 and 2).
Each case runs in a process of its own (Accelerate's state is a process-wide singleton), as one
rank of a CPU job."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("accelerate")

PROGRAM = """
import torch
from accelerate.utils import FullyShardedDataParallelPlugin
from shardwise.accelerate import Accelerator
{body}
"""
CASES = {
    "two_deepspeed_plugins": (
        "from accelerate.utils import DeepSpeedPlugin\n"
        "Accelerator(deepspeed_plugin={'a': DeepSpeedPlugin(), 'b': DeepSpeedPlugin()})",
        {},
        "takes one DeepSpeed plugin",
    ),
    "deepspeed_optimizer_groups": (
        "model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "optimizer = torch.optim.AdamW([{'params': model[0].parameters()},\n"
        "    {'params': model[1].parameters(), 'weight_decay': 0.0}])\n"
        "loader = torch.utils.data.DataLoader(torch.zeros(4, 2), batch_size=2)\n"
        "Accelerator().prepare(model, optimizer, loader)",
        {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"},
        "parameter groups differ in weight_decay",
    ),
    "fsdp2_ignored_modules": (
        "model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "plugin = FullyShardedDataParallelPlugin(fsdp_version=2, ignored_modules=[model[0]])\n"
        "Accelerator(fsdp_plugin=plugin).prepare(model, optimizer)",
        {},
        "ignored_modules is not supported",
    ),
    "ignored_modules": (
        "model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))\n"
        "plugin = FullyShardedDataParallelPlugin(ignored_modules=[model[0]])\n"
        "Accelerator(fsdp_plugin=plugin).prepare(model)",
        {},
        "ignored_modules is not supported",
    ),
}


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_shardwise_does_not_run_is_refused_with_the_fix(case):
    body, env, message = CASES[case]
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port(), **env)  # fmt: skip
    program = PROGRAM.format(body=textwrap.dedent(body))
    proc = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    error = "ValueError" in proc.stderr or "ConfigError" in proc.stderr  # a ValueError
    assert error and message in proc.stderr, proc.stderr[-3000:]
