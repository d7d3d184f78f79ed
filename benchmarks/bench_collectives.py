"""CPU collectives benchmark in the style of nccl-tests: shardwise beside gloo (and OpenMPI).

For each op (all_reduce, all_gather, reduce_scatter), world size and per-rank buffer size from
--min-bytes to --max-bytes, every backend runs warm-up iterations, then BATCHES timed batches
after a barrier; time is the max over ranks of the median batch's mean per iteration (the median
keeps one batch disturbed by another tenant of this shared 2-core VM out of the result; every
backend, OpenMPI included, is timed the same way). algbw = bytes / time; busbw uses
nccl-tests' factors: 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter (whose
size is the full gathered / scattered buffer). Every run checks its result on integer-valued
data unique per rank and element (exact in float32); `wrong` counts mismatching elements.

Run: python benchmarks/bench_collectives.py --output benchmarks/results/DATE-collectives-cpu.md

--launches N measures what a user gets from one launch: N fresh launches per backend,
interleaved (shardwise, gloo, the copy limit, shardwise, ...), each timing every size once; per
size the table gives the minimum, median and maximum over launches, and for the largest size
every launch's figure. The copy limit is this machine's memory speed in the same run: `world`
processes at once, each copying a buffer of the largest size into another (GB/s per process).
A two-copy transport (into shared memory, out of it) moves each all_reduce byte four times per
rank, so half the copy limit is about the most its all_reduce busbw can reach.
"""

import argparse
import datetime
import functools
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def sizes(args) -> list[int]:
    out, n = [], args.min_bytes
    while n <= args.max_bytes:
        out.append(n)
        n *= args.factor
    return out


BATCHES = 5


def iterations(nbytes: int) -> tuple[int, int]:
    """(warm-up, per-batch) iterations: ~128 MiB moved per batch, between 2 and 100."""
    per_batch = max(2, min(100, (128 << 20) // max(nbytes, 1)))
    return max(1, per_batch // 5), per_batch


def median_batch_time(call, barrier, per_batch: int) -> float:
    """Seconds per call: the median over BATCHES batches of per_batch calls each."""
    import statistics

    means = []
    for _ in range(BATCHES):
        barrier()
        start = time.perf_counter()
        for _ in range(per_batch):
            call()
        means.append((time.perf_counter() - start) / per_batch)
    return statistics.median(means)


def expected(op: str, rank: int, world: int, count: int):
    import torch

    base = torch.arange(count, dtype=torch.float32) % 997
    if op == "all_reduce":
        return base * world + 1000 * sum(range(world))
    if op == "all_gather":
        return torch.cat([base + 1000 * r for r in range(world)])
    block = count // world  # reduce_scatter: this rank's block of the sum
    return (base * world + 1000 * sum(range(world)))[rank * block : (rank + 1) * block]


def run_torch_rank(backend: str, op: str, nbytes_list: list[int]) -> None:
    """One rank: measures every size for one backend/op, prints JSON lines on rank 0."""
    import warnings

    import shardwise  # noqa: F401
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renamed collectives
    # The non-deprecated names where this torch has them (2.14: all_gather_single,
    # reduce_scatter_single); the deprecated ones warn on every call, which costs microseconds.
    all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)

    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    for nbytes in nbytes_list:
        count = max(world, nbytes // 4 // world * world)
        data = torch.arange(count, dtype=torch.float32) % 997 + 1000 * rank
        if op == "all_reduce":  # in place: checked after the first call, then timed as is
            out = data.clone()
            call = functools.partial(dist.all_reduce, out)
        elif op == "all_gather":
            out = torch.empty(count * world)
            call = functools.partial(all_gather, out, data)
        else:
            out = torch.empty(count // world)
            call = functools.partial(reduce_scatter, out, data)
        warmup, per_batch = iterations(nbytes)
        call()
        wrong = int((out != expected(op, rank, world, count)).sum())
        for _ in range(warmup):
            call()
        elapsed = torch.tensor([median_batch_time(call, dist.barrier, per_batch)])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        wrong_total = torch.tensor([wrong])
        dist.all_reduce(wrong_total)
        if rank == 0:
            size = count * 4 * (world if op == "all_gather" else 1)
            print(
                json.dumps(
                    {"bytes": size, "time": elapsed.item(), "wrong": int(wrong_total.item())}
                ),
                flush=True,
            )
    dist.destroy_process_group()


def run_copy_rank(nbytes: int) -> None:
    """One process of the copy limit: GB/s copying nbytes into another buffer (median batch)."""
    import torch

    source = torch.arange(nbytes // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    _, per_batch = iterations(nbytes)
    for _ in range(per_batch):
        target.copy_(source)
    seconds = median_batch_time(lambda: target.copy_(source), lambda: None, per_batch)
    print(json.dumps({"bytes": nbytes, "copy GB/s": nbytes / seconds / 1e9}), flush=True)


def launch(argv: list[str], world: int, env_extra: dict) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            OMP_NUM_THREADS="1",
            **env_extra,
        )
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{' '.join(argv)} failed at world {world}")
    return [json.loads(line) for line in outputs[0].splitlines() if line.startswith("{")]


def copy_limit(world: int, nbytes: int) -> float:
    """GB/s per process with `world` processes copying nbytes at once (their median)."""
    import statistics

    argv = [sys.executable, __file__, "--copy-worker", str(nbytes)]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # one thread each, as the ranks run
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(world)]  # fmt: skip
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{' '.join(argv)} failed")
    return statistics.median(json.loads(out.splitlines()[-1])["copy GB/s"] for out in outputs)


def spread(values: list[float]) -> str:
    import statistics

    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


# --launches columns beyond plain backends: shardwise with its rings always written with ordinary
# stores (the behaviour before the measured choice of collectives/store_choice.h).
VARIANTS = {"shardwise-ordinary": ("shardwise", {"SHARDWISE_RING_STORES": "ordinary"})}


def launch_distribution(args, world: int, op: str) -> list[str]:
    """--launches: per size, min / median / max busbw over fresh launches of each backend."""
    nbytes = sizes(args)
    backends = args.backends.split(",")
    runs: dict[str, list[list[dict]]] = {b: [] for b in backends}
    copies: list[float] = []
    for _ in range(args.launches):
        for backend in backends:
            torch_backend, env = VARIANTS.get(backend, (backend, {}))
            argv = [sys.executable, __file__, "--worker", torch_backend, op,
                    ",".join(map(str, nbytes))]  # fmt: skip
            runs[backend].append(launch(argv, world, env))
        copies.append(copy_limit(world, nbytes[-1]))

    def busbw(row: dict) -> float:
        return row["bytes"] / row["time"] / 1e9 * BUS_FACTOR[op](world)

    head = ["bytes"] + [f"{b} busbw GB/s min / median / max" for b in backends] + ["wrong"]
    lines = [f"### {op}, world {world}, {args.launches} fresh launches per backend", "",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]  # fmt: skip
    for i in range(len(nbytes)):
        cells = [str(runs[backends[0]][0][i]["bytes"])]
        cells += [spread([busbw(launch[i]) for launch in runs[b]]) for b in backends]
        cells.append(str(max(launch[i]["wrong"] for b in backends for launch in runs[b])))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Largest size ({nbytes[-1]} bytes per rank), launch by launch, busbw GB/s; "
              f"copy limit = GB/s per process, {world} processes copying at once:", "",
              "| launch | " + " | ".join(backends) + " | copy limit |",
              "|" + "---:|" * (len(backends) + 2)]  # fmt: skip
    for k in range(args.launches):
        cells = [str(k + 1)] + [f"{busbw(runs[b][k][-1]):.2f}" for b in backends]
        lines.append("| " + " | ".join(cells + [f"{copies[k]:.2f}"]) + " |")
    lines.append(
        "| min / median / max | "
        + " | ".join(spread([busbw(r[-1]) for r in runs[b]]) for b in backends)
        + f" | {spread(copies)} |"
    )
    return lines + [""]


def run_mpi(op: str, world: int, nbytes_list: list[int]) -> list[dict] | None:
    if shutil.which("mpirun") is None:
        return None
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    argv = [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        str(world),
        "--bind-to",
        "none",
        sys.executable,
        str(Path(__file__).with_name("mpi_anchor.py")),
        op,
        ",".join(map(str, nbytes_list)),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def median_rows(runs: list[list[dict]]) -> list[dict]:
    """Per size: the median time over rounds, and the most wrong elements any round had."""
    import statistics

    return [
        {
            "bytes": rows[0]["bytes"],
            "time": statistics.median(r["time"] for r in rows),
            "wrong": max(r["wrong"] for r in rows),
        }
        for rows in zip(*runs, strict=True)
    ]


def table(op: str, world: int, results: dict[str, list[dict]]) -> list[str]:
    names = list(results)
    head = ["bytes"] + [f"{n} {c}" for n in names for c in ("us", "busbw GB/s", "wrong")]
    ratios = [n for n in names if n != "shardwise"]
    head += [f"busbw shardwise/{n}" for n in ratios]
    lines = [
        f"### {op}, world {world}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---:|" * len(head),
    ]
    for i, row in enumerate(results["shardwise"]):
        cells = [str(row["bytes"])]
        bus = {}
        for n in names:
            r = results[n][i]
            bus[n] = r["bytes"] / r["time"] / 1e9 * BUS_FACTOR[op](world)
            cells += [f"{r['time'] * 1e6:.1f}", f"{bus[n]:.2f}", str(r["wrong"])]
        cells += [f"{bus['shardwise'] / bus[n]:.1f}x" for n in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        run_torch_rank(sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--copy-worker":
        run_copy_rank(int(sys.argv[2]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--min-bytes", type=parse_bytes, default=4)
    parser.add_argument("--max-bytes", type=parse_bytes, default=256 << 20)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--no-mpi", action="store_true", help="skip the OpenMPI anchor")
    parser.add_argument("--backends", default="shardwise,gloo", help="torch backends to run")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="sweeps per backend, interleaved (shardwise, gloo, openmpi, shardwise, ...); each "
        "size reports the median over rounds, so drift of a shared machine hits all alike",
    )
    parser.add_argument(
        "--launches",
        type=int,
        default=0,
        help="instead of --rounds: this many fresh launches per backend, interleaved, and the "
        "distribution (min / median / max) over them beside the copy limit",
    )
    parser.add_argument("--output")
    args = parser.parse_args()
    if args.launches < 0 or (args.launches and args.rounds != 1):
        parser.error("--launches takes a positive count and replaces --rounds (leave it at 1)")
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in subprocess.run(
                ["lscpu"], capture_output=True, text=True
            ).stdout.splitlines()
            if line.startswith("Model name")
        ),
        platform.processor(),
    )
    import torch

    lines = [
        f"# CPU collectives, shardwise vs gloo vs OpenMPI ({datetime.date.today()})",
        "",
        f"- machine: {cpu}, {os.cpu_count()} cores; torch {torch.__version__}",
        f"- command: `python benchmarks/bench_collectives.py {' '.join(sys.argv[1:])}`",
        "- float32; busbw per nccl-tests; time = max over ranks of the median of 5 timed "
        "batches, then the median over --rounds interleaved sweeps; `wrong` = "
        "mismatching elements against the exact expected result",
        "",
    ]
    print("\n".join(lines), flush=True)
    for world in [int(w) for w in args.world_sizes.split(",")]:
        for op in args.ops.split(","):
            if args.launches:
                block = launch_distribution(args, world, op)
                print("\n".join(block), flush=True)
                lines += block
                continue
            nbytes = sizes(args)
            rounds: dict[str, list[list[dict]]] = {}
            for _ in range(args.rounds):
                for backend in args.backends.split(","):
                    argv = [
                        sys.executable,
                        __file__,
                        "--worker",
                        backend,
                        op,
                        ",".join(map(str, nbytes)),
                    ]
                    rounds.setdefault(backend, []).append(launch(argv, world, {}))
                mpi = None if args.no_mpi else run_mpi(op, world, nbytes)
                if mpi is not None:
                    rounds.setdefault("openmpi", []).append(mpi)
            results = {name: median_rows(runs) for name, runs in rounds.items()}
            block = table(op, world, results)
            print("\n".join(block), flush=True)
            lines += block
    if args.output:
        Path(args.output).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
