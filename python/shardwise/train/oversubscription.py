"""How much slower a host's ranks compute once their threads outnumber its cores: measured.

R ranks of T threads on C cores take turns. If the turns were free, each rank's step would take
``turns = R * T / C`` times as long. They are not free. Each switch evicts the caches the other
rank warmed, and a rank that waits in a collective gives its core away and gets it back only
when a computing rank's slice ends. On this 2-core VM four 1-thread ranks of fsdp x tp 2 x 2
stepped 1.6x slower than 2 turns of the calibrated compute.

So the planner measures the penalty instead of assuming it. ``measure`` starts ``cores`` 1-thread
workers, released together, each timing the same loop for ``seconds``: a tiny GPT's forward,
with an all-reduce of each linear layer's output, and its backward, then an all-reduce of each
gradient, all with its pair (workers 2k and 2k+1, on the shardwise backend), as a rank of a
tensor- or data-parallel pair waits on its peer. Then
``2 * cores`` of them. ``penalty`` is the ratio of their median iterations over the 2 turns,
at least 1, and ``step_time.cpu_contention`` multiplies a row's turns by it. Between 1 and 2
turns it is blended in linearly; beyond 2 turns it is held (measured at 2 only: assumed).
"""

import datetime
import json
import statistics
import sys
import tempfile
import time

# the loop each worker times: the bundled GPT's tiny preset, forward + backward of 8 sequences
WORKLOAD = {"preset": "tiny", "batch": 8}
SECONDS = 3.0


def _worker(folder: str, index: int, workers: int, seconds: float) -> float:
    """Median seconds of one iteration (module docstring), iterated for ``seconds`` after the
    parent's "go" (every worker runs the whole time, so all of them overlap)."""
    import torch
    import torch.distributed as dist

    from .. import distributed  # noqa: F401  (registers the shardwise backend)
    from ..models.gpt import GPT, PRESETS
    from .together import wait_for_go

    torch.set_num_threads(1)
    torch.manual_seed(0)
    paired = index // 2 * 2 + 1 < workers
    if paired:
        store = dist.FileStore(f"{folder}/pair-{index // 2}", 2)
        timeout = datetime.timedelta(seconds=60)  # a lost peer fails the probe, never hangs it
        dist.init_process_group("shardwise", store=store, rank=index % 2, world_size=2,
                                timeout=timeout)  # fmt: skip
    cfg = PRESETS[WORKLOAD["preset"]]
    model = GPT(cfg)
    tokens = torch.zeros(WORKLOAD["batch"], cfg.seq_len, dtype=torch.long)

    def wait_on_peer(_module, _inputs, out):  # a tensor-parallel rank's wait mid-forward
        dist.all_reduce(out.detach().clone())

    for layer in model.modules() if paired else ():
        if isinstance(layer, torch.nn.Linear):
            layer.register_forward_hook(wait_on_peer)

    def iteration():
        model.loss(tokens, tokens).backward()
        for p in model.parameters() if paired else ():
            dist.all_reduce(p.grad)

    def more(end) -> bool:  # the pair decides together, so both run the same collectives
        flag = torch.tensor([float(time.perf_counter() < end)])
        if paired:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    iteration()  # warm-up
    wait_for_go()
    times, end = [], time.perf_counter() + seconds
    while not times or more(end):
        start = time.perf_counter()
        iteration()
        times.append(time.perf_counter() - start)
    if paired:
        dist.barrier()  # the pair leaves together: neither waits on a peer already gone
        dist.destroy_process_group()
    return statistics.median(times)


def _median_iteration(workers: int, seconds: float) -> float:
    """The workers' median iteration (their median) with ``workers`` running at once; their
    stores live in a private temporary folder, removed after."""
    from .together import run_together

    with tempfile.TemporaryDirectory(prefix="shardwise-oversubscription-") as folder:
        command = [sys.executable, "-m", "shardwise.train.oversubscription", folder]
        args = [[str(i), str(workers), str(seconds)] for i in range(workers)]
        done = run_together([[*command, *a] for a in args], timeout=120 + 10 * seconds)
    failed = [i for i, d in enumerate(done) if not d.ok]
    if failed:
        raise RuntimeError(
            f"the oversubscription probe's worker {failed[0]} of {workers} failed:\n"
            f"{done[failed[0]].stderr}"
        )
    return statistics.median(json.loads(d.stdout.strip().splitlines()[-1]) for d in done)


def measure(cores: int | None = None, seconds: float = SECONDS) -> float:
    """The penalty (module docstring): ``2 * cores`` workers' median iteration over ``cores``
    workers', over 2, at least 1."""
    from .device import host_cores

    cores = cores or host_cores()
    full = _median_iteration(cores, seconds)
    over = _median_iteration(2 * cores, seconds)
    return max(1.0, over / full / 2)


def contention(turns: float, penalty: float) -> float:
    """A rank's slowdown at ``turns`` (ranks' threads over cores): none up to 1, then the turns
    times ``penalty`` blended in linearly up to 2 turns (module docstring)."""
    if turns <= 1:
        return 1.0
    return turns * (1 + (penalty - 1) * min(1.0, turns - 1))


if __name__ == "__main__":
    folder, index, workers, seconds = sys.argv[1:5]
    print(json.dumps(_worker(folder, int(index), int(workers), float(seconds))))
