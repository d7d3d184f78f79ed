"""Starts a world of worker processes (tests/distributed/worker.py) once and collects each rank's
results, so many checks share one process-group start-up (the slow part on 2 cores)."""

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import rank_pool

WORKER = Path(__file__).with_name("worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(
    scenario: str,
    world_size: int,
    transport: str = "auto",
    timeout: float = 300,
    master_addr: str = "127.0.0.1",
    wrap=None,
) -> list[dict]:
    """Runs `scenario` on `world_size` ranks over `transport` (SHARDWISE_TRANSPORT); returns each
    rank's {check: "ok" | error} dict. `wrap(rank, argv, env)` may return another (argv, env),
    e.g. to start the rank inside a network namespace."""
    port = free_port()
    with tempfile.TemporaryDirectory() as out:
        procs = []
        for rank in range(world_size):
            env = dict(
                os.environ,
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(port),
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_RANK=str(rank),
                OMP_NUM_THREADS="1",
                SHARDWISE_TRANSPORT=transport,
            )
            argv = [sys.executable, str(WORKER), scenario, out]
            if wrap is not None:
                argv, env = wrap(rank, argv, env)
            procs.append(rank_pool.popen(argv, env))
        logs = []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                partial = [
                    (Path(out) / f"rank{r}.json").read_text()[-2000:]
                    if (Path(out) / f"rank{r}.json").exists()
                    else "{}"
                    for r in range(world_size)
                ]
                raise AssertionError(
                    f"{scenario} at world {world_size} hung past {timeout} s; results so far: "
                    f"{partial}"
                ) from None
        results = []
        for rank in range(world_size):
            path = Path(out) / f"rank{rank}.json"
            results.append(json.loads(path.read_text()) if path.exists() else {})
            results[-1]["__log__"] = logs[rank][-3000:]
            results[-1]["__returncode__"] = procs[rank].returncode
        return results
