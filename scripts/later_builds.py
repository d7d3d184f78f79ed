#!/usr/bin/env python3
"""The builds of `make test`'s later suites, run at idle priority beside the suites before them.

`make test-python` keeps a core idle for much of its time (waiting ranks, launches, time-outs),
while the builds of the suites after it (the CPU-torch and oldest-torch builds, the sanitizers',
the fuzzers') keep both cores busy. `make test` starts those builds in a background lane as
test-python begins; each later suite then waits for its own build instead of running it.

    later_builds.py start --watch PID TARGET...   runs `make TARGET` for each TARGET in turn, in a
                                                  session of its own at nice 19 (its autogroup
                                                  too, where the kernel has them), so it takes
                                                  only what the foreground leaves idle; stops
                                                  them if process PID (make) ends first
    later_builds.py take TARGET -- COMMAND...     in a `make test` whose lane builds TARGET: waits
                                                  for it, prints its output, exits with its status;
                                                  otherwise runs COMMAND (the build itself)

The lane lives in $SHARDWISE_LATER_BUILDS (a folder: TARGET.log, TARGET.status, lane.pid), which
`make test` sets; without it `take` always runs COMMAND, so every make target still builds what
it tests when it is run alone.

A test that measures time (the planner's predicted step against a run's) asks for a quiet machine
with `quiet()`: it leaves a file pause-PID in the folder, and the lane stops every process of the
build's session (SIGSTOP; its compilers too, which ninja puts in process groups of their own)
until no pause file names a live process, then continues them (SIGCONT). A pause whose process
died without removing its file ends at the lane's next poll, and one is never held longer than
MAX_PAUSE_S, so a crashed test cannot stall `make test`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
MAX_PAUSE_S = 900  # the longest a build is held for one pause (a stuck test cannot stall CI)


def lane_folder() -> Path | None:
    folder = os.environ.get("SHARDWISE_LATER_BUILDS")
    return Path(folder) if folder else None


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def lower_priority() -> None:
    """In the child, before exec: a session (so an autogroup) of its own, nice 19 for the group
    and for the process. Nice alone is not enough where the kernel groups tasks by session: the
    group competes with the foreground's group as an equal."""
    os.setsid()
    try:
        Path("/proc/self/autogroup").write_text("19")
    except OSError:
        pass  # no autogroups on this kernel: the process's own nice value is what counts
    os.nice(19)


def pause_wanted(folder: Path) -> bool:
    """Whether a live process asks for a quiet machine (a pause-PID file; a dead one's is
    removed)."""
    wanted = False
    for request in folder.glob("pause-*"):
        try:
            pid = int(request.name.split("-", 1)[1])
        except ValueError:
            pid = -1
        if pid > 0 and alive(pid):
            wanted = True
        else:
            request.unlink(missing_ok=True)
    return wanted


def signal_session(session: int, signum: int) -> None:
    """``signum`` to every process of ``session`` (its builds' compilers included)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue  # the process ended meanwhile
        if int(fields[3]) == session:  # fields after the name: state, ppid, pgrp, session
            with contextlib.suppress(OSError):
                os.kill(int(stat.parent.name), signum)


class Pauser:
    """Holds the lane's current build (a session) while a pause is wanted (module docstring).
    A pause held MAX_PAUSE_S is released and not taken again until no pause is wanted."""

    def __init__(self, folder: Path):
        self.folder, self.since, self.expired = folder, None, False

    def poll(self, session: int) -> None:
        wanted = pause_wanted(self.folder)
        self.expired = self.expired and wanted
        if self.since is not None and time.monotonic() - self.since > MAX_PAUSE_S:
            self.expired = True
        if wanted and not self.expired and self.since is None:
            signal_session(session, signal.SIGSTOP)
            self.since = time.monotonic()
            (self.folder / "paused").write_text(str(session))
        elif self.since is not None and (self.expired or not wanted):
            self.release(session)

    def release(self, session: int) -> None:
        if self.since is not None:
            signal_session(session, signal.SIGCONT)
            self.since = None
            (self.folder / "paused").unlink(missing_ok=True)


@contextlib.contextmanager
def quiet(timeout_s: float = 10.0):
    """While it is held, the lane of this `make test` (if any) builds nothing: a pause-PID file
    for this process, kept until the block ends, and a wait (at most ``timeout_s``) until the
    lane has stopped its build, or has none running."""
    folder = lane_folder()
    if folder is None or not folder.is_dir():
        yield
        return
    request = folder / f"pause-{os.getpid()}"
    request.write_text("")
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and lane_running(folder):
            if (folder / "paused").exists() or _all_built(folder):
                break
            time.sleep(POLL_S / 5)
        yield
    finally:
        request.unlink(missing_ok=True)


def _all_built(folder: Path) -> bool:
    """Whether the lane has built every target it lists (nothing is left to pause)."""
    targets = (folder / "lane.targets").read_text().split()
    return all((folder / f"{t}.status").exists() for t in targets)


def run_lane(folder: Path, targets: list[str], watched: int) -> int:
    """The lane's body (in the daemon): each target in turn; a status file for each, written once
    it ends (a target never reached gets none)."""
    make = os.environ.get("MAKE", "make")
    env = dict(os.environ, SUITE_TIMES_NOTE=" (beside earlier suites)")
    pauser = Pauser(folder)
    for target in targets:
        with (folder / f"{target}.log").open("wb") as log:
            child = subprocess.Popen(
                [make, "--no-print-directory", target],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=lower_priority,
            )
            while child.poll() is None:
                if not alive(watched):  # make ended (failed, or was stopped): so does the lane
                    pauser.release(child.pid)
                    os.killpg(child.pid, signal.SIGTERM)
                    child.wait()
                    return 1
                pauser.poll(child.pid)  # the child leads a session of its own (lower_priority)
                time.sleep(POLL_S)
            pauser.release(child.pid)
        (folder / f"{target}.status").write_text(str(child.returncode))
    return 0


def start(targets: list[str], watched: int) -> int:
    folder = lane_folder()
    if folder is None:
        print("later_builds.py start: SHARDWISE_LATER_BUILDS is not set", file=sys.stderr)
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    (folder / "lane.targets").write_text("\n".join(targets) + "\n")
    daemon = os.fork()
    if daemon > 0:  # the caller returns at once; the daemon below runs the lane
        (folder / "lane.pid").write_text(str(daemon))
        return 0
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # nothing of make's output held open: its readers see it end
        os.dup2(devnull, fd)
    code = 1
    try:
        code = run_lane(folder, targets, watched)
    finally:
        os._exit(code)


def lane_running(folder: Path) -> bool:
    try:
        return alive(int((folder / "lane.pid").read_text()))
    except (OSError, ValueError):
        return False


def take(target: str, command: list[str]) -> int:
    folder = lane_folder()
    listed = folder is not None and (folder / "lane.targets").exists()
    if not listed or target not in (folder / "lane.targets").read_text().split():
        return subprocess.call(command)
    status = folder / f"{target}.status"
    waited = time.monotonic()
    while not status.exists():
        if not lane_running(folder) and not status.exists():
            print(f"later_builds.py: the background lane stopped before it built {target}")
            log = folder / f"{target}.log"
            if log.exists():
                sys.stdout.write(log.read_text(errors="replace"))
            return 1
        time.sleep(POLL_S)
    sys.stdout.write((folder / f"{target}.log").read_text(errors="replace"))
    code = int(status.read_text())
    print(f"later_builds.py: {target} was built beside the earlier suites "
          f"(waited {time.monotonic() - waited:.0f} s for it), exit {code}")  # fmt: skip
    return code


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "start" and argv[1] == "--watch":
        return start(argv[3:], int(argv[2]))
    if len(argv) >= 4 and argv[0] == "take" and argv[2] == "--":
        return take(argv[1], argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
