"""torchrun's multi-node launch line, as a cluster user types it on each node::

    torchrun --nnodes=2 --node_rank=N --nproc_per_node=2 --master_addr=ADDR --master_port=PORT \\
        -m shardwise.train --config examples/configs/fsdp.yaml ...

on two test hosts (network namespaces on a bridge, each with its own hostname:
``hosts.py``), training a 2 × 2 FSDP run that must match the same run on one host with 4
processes (the same global batches; losses to 1e-5, fp32)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hosts import Host, can_make_namespaces, in_host, two_hosts
from train_runs import BASE, CONFIGS, losses, records, train

OVERRIDES = ("training.micro_batch_size=2", "training.max_steps=4", "training.eval_every=0")
PORT = 29517  # free in a namespace made for the test


def _node(host: Host, rank: int, master: str, out) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=host.interface,
               SHARDWISE_SOCKET_IFNAME=host.interface)  # fmt: skip
    command = in_host(host, rank, [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
        "--nproc_per_node=2", f"--master_addr={master}", f"--master_port={PORT}",
        "-m", "shardwise.train", "--config", str(CONFIGS / "fsdp.yaml"), *BASE,
        f"training.checkpoint.dir={out}", *OVERRIDES,
    ])  # fmt: skip
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=out.parent)  # fmt: skip


def test_two_nodes_launched_by_torchrun_train_as_one_node(tmp_path):
    """Catches a launch that works only on one host: the rendezvous at --master_addr from the
    other node, the backend binding to the interface that reaches the master, ranks numbered
    by node (node 1's local rank 0 is global rank 2), and the data split over 4 ranks on two
    hosts not being the one-host split."""
    reason = can_make_namespaces()
    if reason:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    one_host, _ = train(4, "fsdp.yaml", tmp_path / "one", *OVERRIDES)
    out = tmp_path / "two"
    out.mkdir()
    with two_hosts() as hosts:
        nodes = [_node(host, rank, hosts[0][1], out) for rank, host in enumerate(hosts)]
        logs = [node.communicate(timeout=300)[0] for node in nodes]
    for node, log in zip(nodes, logs, strict=True):
        assert node.returncode == 0, log[-6000:]
    assert "world 4" in logs[0]
    two_hosts_losses, reference = losses(records(out)), losses(one_host)
    assert sorted(two_hosts_losses) == [1, 2, 3, 4]
    for step, value in reference.items():
        assert abs(two_hosts_losses[step] - value) <= 1e-5 * abs(value), (step, two_hosts_losses)
