"""Processes started apart and released together, so the work they time overlaps: each imports
what it needs, says ``ready`` on its stdout and waits for ``go`` on its stdin (``wait_for_go``);
``run_together`` starts them all, waits for every ``ready``, then releases them at once. A
calibration's peers and the oversubscription probe's workers run this way: what they measure
is a host whose cores are all busy, as a run's ranks keep them, not one process alone."""

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Finished:
    """One process's end: ``ok`` when it was ready and exited 0; its stdout; its stderr's
    last 2000 characters."""

    ok: bool
    stdout: str
    stderr: str


def run_together(commands: list[list[str]], timeout: float) -> list[Finished]:
    """Every command started, released together once all are ready, and waited for (each at
    most ``timeout`` s after the release; killed after). Their stderr goes to files in a
    private temporary folder, removed after, so no full pipe stalls a process mid-measure."""
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    with tempfile.TemporaryDirectory(prefix="shardwise-together-") as logs:
        procs = []
        for i, command in enumerate(commands):
            with open(Path(logs) / f"{i}.err", "w", encoding="utf-8") as err:
                procs.append(subprocess.Popen(command, stderr=err, **pipes))
        try:
            ready = [proc.stdout.readline().strip() == "ready" for proc in procs]
            for proc in procs:
                if proc.poll() is None:
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
            outs = [proc.communicate(timeout=timeout)[0] for proc in procs]
        finally:
            for proc in procs:
                proc.kill()
        errors = [(Path(logs) / f"{i}.err").read_text()[-2000:] for i in range(len(procs))]
    return [
        Finished(ok and proc.returncode == 0, out, err)
        for ok, proc, out, err in zip(ready, procs, outs, errors, strict=True)
    ]


def wait_for_go() -> None:
    """In the started process, once it is ready to measure: wait for the release."""
    print("ready", flush=True)
    sys.stdin.readline()
