"""The launch pool's zygote (rank_pool.py starts it): imports torch, shardwise and the trainer
once, then forks a supervisor per request, which forks the rank and reports its exit status.
The zygote itself never runs a test's code; a rank becomes the process its request names
(``_run``)."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# What every launch here imports anyway; modules that start threads when imported stay out
# (the zygote refuses to fork with a second thread).
PRELOAD = (
    "torch",
    "torch._dynamo",  # torch.optim's constructor imports it
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch.utils.tensorboard",
    "safetensors.torch",
    "transformers",  # its models, and the accelerate they import, load in the rank
    "shardwise",
    "shardwise.train.cli",
    "shardwise.train.trainer",
    "worker",
)


def _serve(path: str, log: str) -> dict | None:
    """Imports, then forks one supervisor per request; returns the request in the rank process
    (the caller runs it), never in the zygote."""
    import ctypes

    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: ends with its pytest
    sys.path.insert(0, str(HERE))
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:  # not in this environment (the oldest torch's): a rank imports it
            pass
    threads = len(os.listdir("/proc/self/task"))
    late = sorted({"deepspeed", "accelerate"} & set(sys.modules))  # their DS_/ACCELERATE_ vars
    if threads != 1 or late:
        print(f"not ready: {threads} threads, {late} imported", flush=True)
        return None
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    sink = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(sink, 1)
    os.dup2(sink, 2)
    os.close(sink)
    while True:
        conn, _ = listener.accept()
        fds = []
        try:
            header, fds, _, _ = socket.recv_fds(conn, 8, 3)
            (size,) = struct.unpack("!Q", header)
            data = b""
            while len(data) < size:
                data += conn.recv(size - len(data))
            request = json.loads(data)
        except Exception as error:  # a client gone mid-request: the zygote serves the next
            print(f"request dropped: {error!r}", flush=True)
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return _supervise(conn, fds, request)
        conn.close()
        for fd in fds:
            os.close(fd)


def _supervise(conn: socket.socket, fds: list[int], request: dict) -> dict | None:
    """Forks the rank, sends its pid, waits for it and sends its wait status."""
    pid = os.fork()
    if pid == 0:
        conn.close()
        os.setpgid(0, 0)  # the client ends the rank and whatever it started by its group
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        request["__pid__"] = os.getpid()
        return request
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(json.dumps({"status": status}).encode() + b"\n")
    finally:
        os._exit(0)


def _run(request: dict) -> int:
    """Becomes the process ``request["argv"]`` would have started: the same ``sys.argv``,
    ``sys.path[0]``, environment, directory, standard streams and a ``__main__`` of its own."""
    import builtins
    import runpy
    import types

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = request["unbuffered"]  # `python -u`, or PYTHONUNBUFFERED
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding="utf-8",
            errors="backslashreplace" if fd == 2 else "strict",
            line_buffering=fd == 2 and not unbuffered,
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    if "numpy" in sys.modules:  # a fresh process draws its seed from the OS
        sys.modules["numpy"].random.seed()
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    argv = request["argv"]
    try:
        if argv[1] == "-m":
            sys.argv = ["-m", *argv[3:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[2], alter_argv=True)
        else:
            script = os.path.abspath(argv[1])
            sys.argv = argv[1:]
            sys.path[0] = os.path.dirname(os.path.realpath(script))
            main.__file__ = script
            with open(script, "rb") as source:
                code = compile(source.read(), script, "exec")
            exec(code, main.__dict__)
    except SystemExit as end:
        if end.code is None or isinstance(end.code, int):
            return end.code or 0
        print(end.code, file=sys.stderr)
        return 1
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _end(code: int) -> None:
    """Ends the rank as the interpreter ends a process (its threads joined, then its atexit
    handlers, then its streams flushed) but for the teardown of every module, which costs about
    2 s with torch, transformers and dynamo imported: a rank forked here exits at once instead.
    A crash in that teardown is caught by the launches that stay fresh (the CLI's, restarts,
    several nodes, the C++ package's)."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    request = _serve(sys.argv[1], sys.argv[2])
    if request is None:
        sys.exit(3)
    _end(_run(request))
