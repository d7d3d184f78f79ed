"""The latency of one collective, NCCL's own model of it: a ring of n ranks over h hosts takes
``steps`` sequential steps, each waiting for its message to cross one link, and costs

    base + (steps - inter_steps) · intra_step + inter_steps · inter_step

where an all-reduce takes 2(n-1) steps, 2(h-1) of them across hosts; a reduce-scatter, an
all-gather, a broadcast or an all-to-all n-1 and h-1; a point-to-point message one (across
hosts when its peer is on another host). This is NCCL's ``ncclTopoTuneModel``
(``src/graph/tuning.cc``: the ring algorithm's latency table, its Simple protocol, the one NCCL
picks for the megabyte messages of training). The bandwidth term is ``step_time.py``'s (a
row's bytes over its links); this is the time the same collectives take beyond their bytes,
which sets the step of a small model and of a large cluster's many small messages (a ring's
steps grow with its ranks).

The figures, per device: a GPU's are NCCL's own table (base 8.4 µs; a step over NVLink 3.4 µs,
over PCIe 5.7 µs, over the network 9.6 µs); they describe NCCL's ring, not a measurement of
a particular cluster, and a cluster file gives its own (``cluster.py``). This CPU's step is
measured (``calibration.py``: an 8-element all-reduce between two processes on the shardwise
backend, half of its time, with no base; a point-to-point message, which takes another path
through the backend, half a ping-pong); across emulated hosts a step defaults to a TCP
message between hosts of a rack, 50 µs.
"""

from __future__ import annotations

from dataclasses import dataclass

US = 1e-6
# NCCL's ring / Simple latencies (src/graph/tuning.cc), µs: (base, a step within a host)
NCCL_RING = {"h100": (8.4, 3.4), "h200": (8.4, 3.4), "a100": (8.4, 3.4), "l40s": (8.4, 5.7)}
NCCL_NET_STEP_US = 9.6  # a ring step over the network
CPU_INTER_HOST_STEP_US = 50.0  # assumed: a TCP message between hosts of a rack


@dataclass(frozen=True)
class Latency:
    """Seconds a collective waits beyond its bytes (module docstring): a fixed ``base_s`` and
    ``intra_step_s`` / ``inter_step_s`` per ring step within a host / across hosts."""

    base_s: float
    intra_step_s: float
    inter_step_s: float
    # a point-to-point message within a host (None: one ring step, base included)
    message_s: float | None = None

    def seconds(self, kind: str, ranks: int, hosts: int = 1) -> float:
        """One ``kind`` (all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, send)
        over ``ranks`` ranks on ``hosts`` hosts; 0 for a group of one."""
        if ranks <= 1:
            return 0.0
        if kind == "send" and hosts == 1 and self.message_s is not None:
            return self.message_s
        if kind == "send":
            steps, inter = 1, int(hosts > 1)
        elif kind == "all_reduce":
            steps, inter = 2 * (ranks - 1), 2 * (hosts - 1)
        elif kind in ("reduce_scatter", "all_gather", "broadcast", "all_to_all"):
            steps, inter = ranks - 1, hosts - 1
        else:
            raise ValueError(f"no latency model for a {kind!r} collective")
        return self.base_s + (steps - inter) * self.intra_step_s + inter * self.inter_step_s


def latency_for(
    device: str,
    cpu_step_s: float = 0.0,
    cpu_message_s: float | None = None,
    intra_host_us: float | None = None,
    inter_host_us: float | None = None,
) -> Latency:
    """The latency table of ``device`` (module docstring): a GPU's NCCL figures, or this CPU's
    measured step ``cpu_step_s`` and point-to-point message ``cpu_message_s``;
    ``intra_host_us`` / ``inter_host_us`` (a cluster file's) replace the step within a host /
    across hosts."""
    if device == "cpu":
        base, intra, inter = 0.0, cpu_step_s, CPU_INTER_HOST_STEP_US * US
    else:
        base_us, intra_us = NCCL_RING[device]
        base, intra, inter = base_us * US, intra_us * US, NCCL_NET_STEP_US * US
    if intra_host_us is not None:
        intra = intra_host_us * US
    if inter_host_us is not None:
        inter = inter_host_us * US
    message = cpu_message_s if device == "cpu" and intra_host_us is None else None
    return Latency(base, intra, inter, message)


def _probe(rank: int, folder: str, repeats: int) -> None:
    """One of the two ranks of ``measure_cpu_step``: rank 0 writes the seconds per step."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    from .. import distributed  # noqa: F401  (registers the shardwise backend)

    torch.set_num_threads(1)
    store = dist.FileStore(f"{folder}/store", 2)
    timeout = datetime.timedelta(seconds=60)  # a lost peer fails the probe, never hangs it
    dist.init_process_group("shardwise", store=store, rank=rank, world_size=2, timeout=timeout)
    try:
        x = torch.zeros(8)
        for _ in range(repeats // 4):  # warm-up: the transport's first messages
            dist.all_reduce(x)
        best = float("inf")
        for _ in range(5):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(repeats):
                dist.all_reduce(x)
            best = min(best, (time.perf_counter() - start) / repeats)
        message = float("inf")
        for _ in range(5):  # ping-pong: two messages a round
            dist.barrier()
            start = time.perf_counter()
            for _ in range(repeats // 4):
                if rank == 0:
                    dist.send(x, 1)
                    dist.recv(x, 1)
                else:
                    dist.recv(x, 0)
                    dist.send(x, 0)
            message = min(message, (time.perf_counter() - start) / (repeats // 4) / 2)
        if rank == 0:  # an all-reduce of 2 ranks takes 2 ring steps
            with open(f"{folder}/seconds", "w", encoding="utf-8") as f:
                f.write(f"{best / 2!r} {message!r}")
    finally:
        dist.destroy_process_group()


def measure_cpu_step(repeats: int = 200) -> tuple[float, float]:
    """Seconds of one ring step and of one point-to-point message on this CPU, between two
    fresh processes on the shardwise backend: an 8-element all-reduce (best of 5 rounds of
    ``repeats``), halved (two steps), and half a ping-pong of 8 elements (best of 5); the
    processes rendezvous through a file in a private temporary folder, removed after."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="shardwise-latency-") as folder:
        mp.start_processes(_probe, args=(folder, repeats), nprocs=2, start_method="spawn")
        with open(f"{folder}/seconds", encoding="utf-8") as f:
            step, message = map(float, f.read().split())
    if not (step > 0 and message > 0):
        raise RuntimeError(f"the collective latency probe measured {step!r} s, {message!r} s")
    return step, message
