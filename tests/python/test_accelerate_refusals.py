"""shardwise.accelerate.Accelerator refuses what shardwise does not run, naming the key and the
fix, before any training: DeepSpeed through Accelerate, FSDP version 2, FSDP's ignored_modules.
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
    "deepspeed": (
        "Accelerator()",
        {"ACCELERATE_USE_DEEPSPEED": "true"},
        "import shardwise.deepspeed as deepspeed",
    ),
    "fsdp2": (
        "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))",
        {},
        "set fsdp_version: 1",
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
    assert "ValueError" in proc.stderr and message in proc.stderr, proc.stderr[-3000:]
