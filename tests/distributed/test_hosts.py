"""Ranks on emulated hosts (hosts.py: namespaces on a bridge, links shaped with tc's tbf): 2 hosts
x 2 ranks at 1 Gbit/s, all-reduce, reduce-scatter and all-gather across hosts taken
hierarchically (within each host over shared memory, across over TCP) against the flat rings over
every rank, in the same test."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hosts import Host, can_make_namespaces, emulated_hosts, start_ranks
from launcher import free_port

SCRIPT = """
import hashlib, json, socket, torch, torch.distributed as dist, shardwise
dist.init_process_group("shardwise")
rank, world = dist.get_rank(), dist.get_world_size()
def exact(count, r):  # values in {-1, 0, 1}: every sum is exact
    return (torch.arange(count, dtype=torch.float32) * 7 + r) % 3 - 1
checks = []
for count in (1000, 1 << 20):  # the direct exchange's size, then the rings'
    x = exact(count, rank)
    dist.all_reduce(x)
    checks.append(torch.equal(x, sum(exact(count, r) for r in range(world))))
y = torch.randn(300001, generator=torch.Generator().manual_seed(rank))
dist.all_reduce(y)
for count in (1000, 1 << 18):  # per rank: one message, then many segments
    blocks = exact(count * world, rank)
    mine = torch.empty(count)
    dist.reduce_scatter_tensor(mine, blocks)
    whole = sum(exact(count * world, r) for r in range(world))
    checks.append(torch.equal(mine, whole[rank * count:(rank + 1) * count]))
    gathered = torch.empty(count * world)
    dist.all_gather_into_tensor(gathered, exact(count, rank))
    checks.append(torch.equal(gathered, torch.cat([exact(count, r) for r in range(world)])))
print(json.dumps({"host": socket.gethostname(), "exact": checks,
                  "inexact": hashlib.sha256(y.numpy().tobytes()).hexdigest()}))
dist.destroy_process_group()
"""


def sent_bytes(host: Host) -> int:
    """Bytes host's link has sent (its tbf qdisc's counter)."""
    text = subprocess.run(["ip", "netns", "exec", host.namespace, "tc", "-s", "qdisc", "show",
                           "dev", host.interface], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip
    return int(re.search(r"Sent (\d+) bytes", text).group(1))


def launch(hosts: list[Host], per_host: int, script, env_extra: dict) -> tuple[list[dict], int]:
    """Each rank's JSON line, and the bytes all hosts' links sent during the launch."""
    before = sum(sent_bytes(h) for h in hosts)
    procs = start_ranks(hosts, per_host, [sys.executable, str(script)], str(free_port()),
                        env_extra)  # fmt: skip
    results = []
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"rank {rank}: {err[-3000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results, sum(sent_bytes(h) for h in hosts) - before


def on_two_hosts(tmp_path, script: str, envs: list[dict]) -> list[tuple[list[dict], int]]:
    """`script` launched once per environment in `envs` on 2 hosts x 2 ranks, links at 1 Gbit/s
    (skipped where network namespaces cannot be made)."""
    reason = can_make_namespaces()
    if reason:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    path = tmp_path / "script.py"
    path.write_text(script)
    with emulated_hosts(2, rate="1gbit") as hosts:
        return [launch(hosts, 2, path, env) for env in envs]


def test_hierarchical_collectives_across_shaped_hosts_match_the_flat_rings(tmp_path):
    """Catches the hierarchical all-reduce, reduce-scatter or all-gather (chosen because the group
    spans hosts) giving another result than the flat rings on exact data, the all-reduce's ranks
    disagreeing in a single bit, and a hierarchy that does not save inter-host bytes (each host's
    link carries 2 (H - 1) / H of an all-reduced buffer each way against the flat ring's
    2 (n - 1) / n, and (H - 1) / H of a reduce-scattered or all-gathered one against
    (n - 1) / n: 2/3 of the flat bytes here, counted by the links' own tbf counters), or one that
    never took the shaped links at all."""
    (hierarchical, hierarchical_bytes), (flat, flat_bytes) = on_two_hosts(
        tmp_path, SCRIPT, [{}, {"SHARDWISE_HIERARCHICAL": "0"}]
    )
    for results in (hierarchical, flat):
        assert [r["host"] for r in results] == ["host0", "host0", "host1", "host1"]
        assert all(r["exact"] == [True] * 6 for r in results), results
        assert len({r["inexact"] for r in results}) == 1, results  # bit-identical on every rank
    # float32 bytes per rank: all-reduced (the flat ring sends 1.5x across each of 2 hosts), then
    # reduce-scattered (input) and all-gathered (output; 0.75x of each across each host)
    reduced, scattered = 4 * ((1 << 20) + 300001 + 1000), 4 * 4 * ((1 << 18) + 1000)
    payload = 2 * 1.5 * reduced + 2 * 2 * 0.75 * scattered
    assert flat_bytes > payload, (flat_bytes, payload)
    assert hierarchical_bytes < 0.75 * flat_bytes, (hierarchical_bytes, flat_bytes)


HPZ_SCRIPT = """
import hashlib, json, os, socket, torch, torch.distributed as dist, shardwise, shardwise.zero
from shardwise import _C
from torch import nn
dist.init_process_group("shardwise")
rank, world = dist.get_rank(), dist.get_world_size()
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(4))
        self.head = nn.Linear(256, 8)
    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)
torch.manual_seed(0)
config = {"train_micro_batch_size_per_gpu": 4,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
          "zero_optimization": {"stage": 3, "zero_hpz_partition_size": int(os.environ["HPZ"])}}
engine = shardwise.zero.initialize(Net(), config)
sent, losses = [], []
for step in range(4):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4 * world, 256, generator=g)[rank * 4:(rank + 1) * 4]
    before = _C.tcp_bytes_sent()
    loss = engine(x).square().mean()
    engine.backward(loss)
    engine.step()
    sent.append(_C.tcp_bytes_sent() - before)
    losses.append(loss.item())
state = engine.module.state_dict()
digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in state.values())).hexdigest()
print(json.dumps({"host": socket.gethostname(), "losses": losses, "digest": digest,
                  "sent": sent[1:]}))
dist.destroy_process_group()
"""


def test_zero_hpz_keeps_backward_gathers_inside_each_host(tmp_path):
    """ZeRO++'s zero_hpz_partition_size = the ranks per host, on 2 shaped hosts x 2 ranks:
    backward's all-gathers stay within each host, so the bytes each rank sends to the other host
    per step (the TCP links' own count) fall to about two thirds (the forward's all-gather and
    the reduce-scatter still cross; the backward's all-gather no longer does), and training is
    bit-identical to plain stage 3. Catches the key parsed but backward still gathering across
    hosts, and a secondary partition that changes the result."""
    (plain, _), (hpz, _) = on_two_hosts(tmp_path, HPZ_SCRIPT, [{"HPZ": "1"}, {"HPZ": "2"}])
    for results in (plain, hpz):
        assert [r["host"] for r in results] == ["host0", "host0", "host1", "host1"]
    assert [r["losses"] for r in hpz] == [r["losses"] for r in plain]
    assert len({r["digest"] for r in plain + hpz}) == 1
    per_step = {
        name: sum(sum(r["sent"]) for r in rs) for name, rs in (("plain", plain), ("hpz", hpz))
    }
    assert 0 < per_step["hpz"] < 0.75 * per_step["plain"], per_step


def test_pinned_hosts_compute_on_their_own_cores_and_size_their_threads_by_them():
    """Catches an emulated host's ranks seeing the machine's cores instead of their own (the
    training benchmark across hosts then runs 2-thread ranks on 1-core hosts, taking turns
    that no host of the cluster file has): each pinned host's process runs on its own core,
    and a rank sizes its threads by the cores it may run on, not by ``os.cpu_count``."""
    import os

    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs a core per host")
    reason = can_make_namespaces()
    if reason:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    probe = (
        "import json, os; from shardwise.train.device import cpu_threads_per_rank; "
        "print(json.dumps([sorted(os.sched_getaffinity(0)), cpu_threads_per_rank(1)]))"
    )
    with emulated_hosts(2) as hosts:
        procs = start_ranks(hosts, 1, [sys.executable, "-c", probe], str(free_port()), cores=1)
        seen = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-2000:]
            seen.append(json.loads(out.strip().splitlines()[-1]))
    assert seen == [[[0], 1], [[1], 1]]
    with pytest.raises(ValueError, match="give fewer hosts or cores"):
        start_ranks(hosts, 1, ["true"], "1", cores=os.cpu_count())
