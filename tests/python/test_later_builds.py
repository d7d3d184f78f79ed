"""scripts/later_builds.py's pause: a test that measures time asks the background build lane for a
quiet machine, and the lane stops its build's whole session while a live process asks."""

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "later_builds.py"
BUSY = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'while True: pass']); " \
    "subprocess.Popen([sys.executable, '-c', 'import os; os.setpgid(0, 0)\\nwhile True: pass'])" \
    "\nwhile True: pass"  # fmt: skip


@pytest.fixture
def lane(monkeypatch):
    spec = importlib.util.spec_from_file_location("later_builds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def build():
    """A stand-in build: a session of three busy processes, one in a process group of its own
    (as ninja runs its compilers)."""
    child = subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(_session(child.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_session(child.pid)) == 3
    yield child.pid
    os.killpg(child.pid, signal.SIGCONT)
    for pid in _session(child.pid):
        os.kill(pid, signal.SIGKILL)
    child.wait()


def _session(session: int) -> dict[int, str]:
    """pid -> state of each process of ``session``."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            found[int(stat.parent.name)] = fields[0]
    return found


def _states(session: int) -> set[str]:
    time.sleep(0.2)  # a signal is delivered asynchronously
    return {"T" if s in "Tt" else "R" for s in _session(session).values()}


def test_a_live_request_stops_the_whole_session_and_its_end_continues_it(lane, build, tmp_path):
    """Catches a pause that stops only make's process group, leaving ninja's compilers (each in
    a group of its own) running beside the measurement, and one never released."""
    pauser = lane.Pauser(tmp_path)
    (tmp_path / f"pause-{os.getpid()}").write_text("")
    pauser.poll(build)
    assert _states(build) == {"T"} and (tmp_path / "paused").exists()
    (tmp_path / f"pause-{os.getpid()}").unlink()
    pauser.poll(build)
    assert _states(build) == {"R"} and not (tmp_path / "paused").exists()


def test_a_dead_requester_or_an_expired_pause_releases_the_build(
    lane, build, tmp_path, monkeypatch
):
    """Catches a crashed test (its pause file left behind) or a stuck one stalling `make test`:
    a dead process's request is removed, and a pause held MAX_PAUSE_S is released for good."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (tmp_path / f"pause-{dead.stdout.strip()}").write_text("")
    pauser = lane.Pauser(tmp_path)
    pauser.poll(build)
    assert _states(build) == {"R"} and not list(tmp_path.glob("pause-*"))
    (tmp_path / f"pause-{os.getpid()}").write_text("")
    pauser.poll(build)
    assert _states(build) == {"T"}
    monkeypatch.setattr(lane, "MAX_PAUSE_S", 0.0)
    pauser.poll(build)
    assert _states(build) == {"R"}
    pauser.poll(build)  # the same request is not taken again
    assert _states(build) == {"R"}


def test_quiet_without_a_lane_is_a_no_op_and_with_one_waits_for_the_pause(
    lane, tmp_path, monkeypatch
):
    """Catches a quiet() that measures before the lane has stopped its build, or that leaves
    its request behind."""
    monkeypatch.delenv("SHARDWISE_LATER_BUILDS", raising=False)
    with lane.quiet():
        pass
    monkeypatch.setenv("SHARDWISE_LATER_BUILDS", str(tmp_path))
    (tmp_path / "lane.targets").write_text("a\n")
    (tmp_path / "lane.pid").write_text(str(os.getpid()))  # a running lane
    threading.Timer(0.3, (tmp_path / "paused").write_text, ("1",)).start()
    started = time.monotonic()
    with lane.quiet(timeout_s=5):
        waited = time.monotonic() - started
        held = list(tmp_path.glob("pause-*"))
    assert 0.3 <= waited < 5 and held == [tmp_path / f"pause-{os.getpid()}"]
    assert not list(tmp_path.glob("pause-*"))
