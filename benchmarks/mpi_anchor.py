"""The OpenMPI anchor of bench_collectives.py: the same sizes, timing and correctness check
with mpi4py (Allreduce, Allgather, Reduce_scatter_block) on float32 numpy buffers.

Run by bench_collectives.py as: mpirun -np N python benchmarks/mpi_anchor.py OP SIZES
"""

import functools
import json
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from bench_collectives import iterations, median_batch_time  # noqa: E402


def main() -> None:
    op, sizes = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    for nbytes in sizes:
        count = max(world, nbytes // 4 // world * world)
        base = (np.arange(count) % 997).astype(np.float32)
        data = base + np.float32(1000 * rank)
        total = base * world + np.float32(1000 * sum(range(world)))
        if op == "all_reduce":
            out = np.empty_like(data)
            call = functools.partial(comm.Allreduce, data, out, op=MPI.SUM)
            want = total
        elif op == "all_gather":
            out = np.empty(count * world, dtype=np.float32)
            call = functools.partial(comm.Allgather, data, out)
            want = np.concatenate([base + np.float32(1000 * r) for r in range(world)])
        else:
            out = np.empty(count // world, dtype=np.float32)
            call = functools.partial(comm.Reduce_scatter_block, data, out, op=MPI.SUM)
            block = count // world
            want = total[rank * block : (rank + 1) * block]
        warmup, per_batch = iterations(nbytes)
        call()
        wrong = int((out != want).sum())
        for _ in range(warmup):
            call()
        elapsed = comm.allreduce(median_batch_time(call, comm.Barrier, per_batch), op=MPI.MAX)
        wrong = comm.allreduce(wrong, op=MPI.SUM)
        if rank == 0:
            size = count * 4 * (world if op == "all_gather" else 1)
            print(json.dumps({"bytes": size, "time": elapsed, "wrong": wrong}), flush=True)


if __name__ == "__main__":
    main()
