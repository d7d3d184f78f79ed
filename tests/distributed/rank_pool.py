"""A pool for the tests' launches: one process that has imported torch, shardwise and the trainer
once (the zygote), and forks a fresh process for each rank a test starts.

Most of a distributed test's time on 2 cores was start-up: torchrun imports torch, then every
rank imports torch, shardwise and the trainer again before it checks anything. A forked rank
starts from the zygote's imports in milliseconds, and is still a process of its own: it builds
its own process group, a kill or a hang ends only that launch (every rank is killed by its
process group at the test's time-out), and nothing it does reaches the next test. The zygote
itself never runs a test's code; if it dies, the next launch starts a new one.

``run(argv, ...)`` takes the place of ``subprocess.run`` for a launch of Python:
- ``python -m MODULE ...`` and ``python SCRIPT ...`` run in one forked process;
- ``python -m torch.distributed.run --standalone --nproc_per_node=N ...`` (no other torchrun
  option) runs as torchrun's standalone agent runs its workers: the agent's TCPStore hosted
  here, every rank with the environment torchrun gives it (``RANK``, ``LOCAL_RANK``,
  ``TORCHELASTIC_USE_AGENT_STORE`` ...), one failed rank stopping the others (SIGTERM, then
  SIGKILL), exit status 1 when any rank failed;
- anything else, or an environment that differs from the zygote's in a variable read when a
  module is imported (see ``FORK_SAFE_VARIABLES``), runs as a fresh process, as before.

What a forked rank shares with its siblings that fresh processes would not: the string hash
seed (``PYTHONHASHSEED``), so ranks iterate equal sets in the same order. ``SHARDWISE_TEST_FRESH=1``
turns the pool off: every launch is a fresh process (what the tests did before the pool).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Variables read only after start-up (by the launcher's rendezvous, the trainer or the backend
# when a group is built): a fork may set them to anything. Any other difference from the
# zygote's environment could have been read while the zygote imported, so it needs a fresh
# process. OMP_NUM_THREADS is fixed at 1 in the zygote and every launch here asks for 1.
FORK_SAFE_VARIABLES = re.compile(
    r"(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|"
    r"ROLE_NAME|ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_\w+|"
    r"TORCH_NCCL_ASYNC_ERROR_HANDLING|PYTHONUNBUFFERED|SHARDWISE_(?!DEBUG|CPU_ISA)\w+|DS_\w+|"
    r"ACCELERATE_\w+|PYTEST_\w+)"
)


class _Zygote:
    """The zygote process and the socket it listens on; started on first use."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="shardwise-pool-")
        self.path = os.path.join(self.dir, "zygote.sock")
        self.log = os.path.join(self.dir, "zygote.log")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "zygote.py"), self.path, self.log],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise RuntimeError(f"the launch pool's zygote did not start: {line or 'no word'}")
        atexit.register(self.close)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def fork(self, request: dict, fds: list[int]) -> _Forked:
        """Starts ``request`` (argv, env, cwd, unbuffered) with ``fds`` as its stdin, stdout and
        stderr."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        data = json.dumps(request).encode()
        socket.send_fds(conn, [struct.pack("!Q", len(data))], fds)
        conn.sendall(data)
        return _Forked(conn)


class _Forked:
    """One forked process: its pid, and its wait status when it ends."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.reader = conn.makefile("r")
        self.pid = json.loads(self.reader.readline())["pid"]
        self.returncode: int | None = None

    def fileno(self) -> int:
        return self.conn.fileno()

    def collect(self) -> int:
        """The exit status as subprocess gives it (-N for signal N); call once readable."""
        line = self.reader.readline()  # none: the supervisor itself was killed
        status = json.loads(line)["status"] if line else int(signal.SIGKILL)
        self.returncode = os.waitstatus_to_exitcode(status)
        self.conn.close()
        return self.returncode

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            pass


_zygote: _Zygote | None = None
_lock = threading.Lock()
LAUNCHES = {"forked launches": 0, "forked ranks": 0, "fresh launches": 0}


def _report() -> None:
    if any(LAUNCHES.values()):
        print("launch pool: " + ", ".join(f"{n} {k}" for k, n in LAUNCHES.items()), file=sys.stderr)


atexit.register(_report)


def _pool() -> _Zygote:
    global _zygote
    with _lock:
        if _zygote is None or not _zygote.alive():
            _zygote = _Zygote()
        return _zygote


def shutdown() -> None:
    global _zygote
    with _lock:
        if _zygote is not None:
            _zygote.close()
            _zygote = None


def enabled() -> bool:
    return os.environ.get("SHARDWISE_TEST_FRESH", "") in ("", "0") and _unavailable is None


def _forkable(argv: list[str], env: dict) -> bool:
    if not enabled() or len(argv) < 2 or argv[0] != sys.executable:
        return False
    if argv[1] == "-m":
        if len(argv) < 3 or argv[2] == "torch.distributed.run":
            return False
    elif argv[1].startswith("-") or not argv[1].endswith(".py"):
        return False
    base = _zygote.env if _zygote is not None else dict(os.environ, OMP_NUM_THREADS="1")
    changed = {k for k in set(base) | set(env) if base.get(k) != env.get(k)}
    return all(FORK_SAFE_VARIABLES.fullmatch(k) for k in changed) and _available()


_unavailable: str | None = None


def _available() -> bool:
    """Whether a zygote runs (started here on first use); a zygote that cannot start (a module
    that starts a thread when imported) turns the pool off for the session, said once."""
    global _unavailable
    if _unavailable is None:
        try:
            _pool()
        except RuntimeError as error:
            _unavailable = str(error)
            print(f"launch pool off, every launch fresh: {error}", file=sys.stderr)
    return _unavailable is None


def _standalone_ranks(argv: list[str]) -> tuple[int, list[str]] | None:
    """torchrun's ``--standalone --nproc_per_node=N`` and what its workers run, if that is all
    the launch asks of torchrun; else None."""
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    if argv[:4] != head or len(argv) < 6:
        return None
    count = re.fullmatch(r"--nproc_per_node=(\d+)", argv[4])
    rest = argv[5:]
    if count is None or (rest[0].startswith("-") and rest[0] != "-m"):
        return None
    return int(count.group(1)), [sys.executable, *rest]


def _rank_environments(count: int, env: dict, port: int, errors: str) -> list[dict]:
    """What torchrun's local agent adds to each worker's environment (one node, no restarts);
    ``errors``: the folder of the ranks' error files (``torch.distributed.elastic``'s
    ``@record`` writes a failed rank's exception there)."""
    base = dict(env)
    base.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default with several workers
    run_id = str(uuid.uuid4())
    return [
        dict(
            base,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            GROUP_RANK="0",
            ROLE_RANK=str(rank),
            ROLE_NAME="default",
            LOCAL_WORLD_SIZE=str(count),
            WORLD_SIZE=str(count),
            GROUP_WORLD_SIZE="1",
            ROLE_WORLD_SIZE=str(count),
            MASTER_ADDR="localhost",  # the standalone rendezvous's endpoint
            MASTER_PORT=str(port),
            TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS="0",
            TORCHELASTIC_RUN_ID=run_id,
            TORCHELASTIC_USE_AGENT_STORE="True",
            TORCH_NCCL_ASYNC_ERROR_HANDLING=env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            TORCHELASTIC_ERROR_FILE=os.path.join(errors, str(rank), "error.json"),
            TORCHELASTIC_SIGNALS_TO_HANDLE="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        )
        for rank in range(count)
    ]


def run(
    argv: list[str],
    *,
    env: dict | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float | None = None,
    capture_output: bool = False,
    text: bool = False,
    stdout=None,
    stderr=None,
) -> subprocess.CompletedProcess:
    """``subprocess.run``'s result for ``argv``, forked from the zygote where it can be (see
    the module's docstring), else from a fresh process."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    if capture_output:
        stdout, stderr = subprocess.PIPE, subprocess.PIPE
    standalone = _standalone_ranks(argv) if enabled() else None
    if standalone is not None and _forkable(standalone[1], dict(env, OMP_NUM_THREADS="1")):
        count, rank_argv = standalone
        return _run_forked(argv, [rank_argv] * count, None, env, cwd, timeout, stdout, stderr, text)
    if standalone is None and _forkable(argv, env):
        return _run_forked(argv, [argv], [env], env, cwd, timeout, stdout, stderr, text)
    LAUNCHES["fresh launches"] += 1
    return subprocess.run(
        argv, env=env, cwd=cwd, timeout=timeout, stdout=stdout, stderr=stderr, text=text
    )


def _run_forked(argv, rank_argvs, envs, env, cwd, timeout, stdout, stderr, text):
    """Forks one process per rank (torchrun's workers when ``envs`` is None, with the agent's
    store here), collects their output and statuses, and stops the others when one fails."""
    store = errors = None  # torchrun's agent store and error files: its launches only
    unbuffered = envs is None or bool(env.get("PYTHONUNBUFFERED"))  # torchrun runs `python -u`
    if envs is None:
        import torch.distributed as dist

        errors = tempfile.TemporaryDirectory(prefix="shardwise-pool-errors-")
        store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False)
        envs = _rank_environments(len(rank_argvs), env, store.port, errors.name)
    pipes, owned = {}, [os.open(os.devnull, os.O_RDONLY)]
    fds = [owned[0]]
    for name, choice in (("stdout", stdout), ("stderr", stderr)):
        if choice == subprocess.PIPE:
            pipes[name], write = os.pipe()
            owned.append(write)
            fds.append(write)
        elif choice == subprocess.STDOUT:
            fds.append(fds[1])
        elif choice is None:
            owned.append(os.dup(len(fds)))
            fds.append(owned[-1])
        else:
            fds.append(choice if isinstance(choice, int) else choice.fileno())
    LAUNCHES["forked launches"] += 1
    LAUNCHES["forked ranks"] += len(rank_argvs)
    try:
        zygote = _pool()
        ranks = [
            zygote.fork({"argv": a, "env": e, "cwd": cwd, "unbuffered": unbuffered}, fds)
            for a, e in zip(rank_argvs, envs, strict=True)
        ]
    finally:
        for fd in owned:
            os.close(fd)
    try:
        output = _collect(ranks, pipes, timeout, argv, text)
    finally:
        del store
        if errors is not None:
            errors.cleanup()
    code = 1 if any(r.returncode != 0 for r in ranks) and len(ranks) > 1 else ranks[0].returncode
    return subprocess.CompletedProcess(argv, code, output.get("stdout"), output.get("stderr"))


def _collect(ranks: list[_Forked], pipes: dict, timeout, argv, text) -> dict:
    deadline = None if timeout is None else time.monotonic() + timeout
    chunks = {name: [] for name in pipes}
    selector = selectors.DefaultSelector()
    for name, fd in pipes.items():
        selector.register(fd, selectors.EVENT_READ, name)
    for rank in ranks:
        selector.register(rank, selectors.EVENT_READ, rank)
    stop_at = None  # torchrun's agent: one worker failed, the rest get SIGTERM, then SIGKILL
    try:
        while selector.get_map():
            now = time.monotonic()
            if deadline is not None and now > deadline:
                for rank in ranks:
                    rank.signal(signal.SIGKILL)
                for rank in ranks:  # reaped before the caller hears of it
                    if rank.returncode is None:
                        rank.collect()
                output = _joined(chunks, text)
                raise subprocess.TimeoutExpired(
                    argv, timeout, output.get("stdout"), output.get("stderr")
                )
            if stop_at is not None and now > stop_at:
                for rank in ranks:
                    rank.signal(signal.SIGKILL)
            for key, _ in selector.select(timeout=0.5):
                if isinstance(key.data, _Forked):
                    selector.unregister(key.fileobj)
                    if key.data.collect() != 0 and stop_at is None and len(ranks) > 1:
                        for rank in ranks:
                            rank.signal(signal.SIGTERM)
                        stop_at = time.monotonic() + 30
                    continue
                data = os.read(key.fileobj, 1 << 16)
                if data:
                    chunks[key.data].append(data)
                else:
                    selector.unregister(key.fileobj)
    finally:
        selector.close()
        for fd in pipes.values():
            os.close(fd)
    return _joined(chunks, text)


class Popen:
    """``subprocess.Popen(argv, env=env, stdout=PIPE, stderr=STDOUT, text=True)`` forked from the
    zygote: ``communicate``, ``kill``, ``poll`` and ``returncode`` as subprocess has them."""

    def __init__(self, argv: list[str], env: dict, cwd: str | None = None) -> None:
        self.args = argv
        read, write = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            request = {"argv": argv, "env": env, "cwd": cwd or os.getcwd(),
                       "unbuffered": bool(env.get("PYTHONUNBUFFERED"))}  # fmt: skip
            self._forked = _pool().fork(request, [stdin, write, write])
        finally:
            os.close(write)
            os.close(stdin)
        self._read = read
        self.pid = self._forked.pid
        self.returncode: int | None = None

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        output = _collect([self._forked], {"stdout": self._read}, timeout, self.args, True)
        self.returncode = self._forked.returncode
        return output["stdout"], None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self._forked.signal(signal.SIGKILL)


def popen(argv: list[str], env: dict, cwd: str | None = None):
    """A rank's process with its output on one text pipe: forked where ``run`` would fork it,
    else ``subprocess.Popen``."""
    if _forkable(argv, env):
        LAUNCHES["forked launches"] += 1
        LAUNCHES["forked ranks"] += 1
        return Popen(argv, env, cwd)
    LAUNCHES["fresh launches"] += 1
    return subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _joined(chunks: dict, text: bool) -> dict:
    joined = {name: b"".join(parts) for name, parts in chunks.items()}
    return {k: v.decode(errors="replace") for k, v in joined.items()} if text else joined
