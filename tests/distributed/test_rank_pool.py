"""The tests' launch pool (rank_pool.py): a forked launch is the process a fresh launch would
be, torchrun's standalone launch is emulated with torchrun's own environment and failure rule,
and a launch that fails, hangs or kills the pool ends alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import rank_pool

SEEN = """
import json, os, sys
names = sorted(k for k in os.environ if k.startswith(("RANK", "LOCAL_", "WORLD", "GROUP_",
               "ROLE_", "MASTER_", "TORCHELASTIC_", "TORCH_NCCL", "OMP_")))
seen = json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
                   "env": {k: os.environ[k] for k in names}, "mine": os.environ.get("MINE"),
                   "stdin": sys.stdin.read()})
if "SEEN_DIR" in os.environ:  # one file per rank: ranks sharing stdout may interleave lines
    with open(os.path.join(os.environ["SEEN_DIR"], os.environ["RANK"] + ".json"), "w") as f:
        f.write(seen)
else:
    print(seen)
"""
VARYING = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")


def _both(argv, tmp_path, **env):
    environment = dict(os.environ, OMP_NUM_THREADS="1", **env)
    kw = {"env": environment, "cwd": tmp_path, "capture_output": True, "text": True}
    fresh = subprocess.run(argv, timeout=120, **kw)
    forked = rank_pool.run(argv, timeout=120, **kw)
    return fresh, forked


def test_a_forked_launch_sees_what_a_fresh_one_sees(tmp_path):
    """Catches a forked process whose argv, sys.path[0], directory, environment, __main__,
    stdin or exit status differ from the fresh process it stands for."""
    script = tmp_path / "seen.py"
    script.write_text(SEEN + "sys.exit(7)\n")
    fresh, forked = _both([sys.executable, str(script), "a", "--b"], tmp_path, MINE="x")
    assert forked.stdout == fresh.stdout and fresh.stdout, (fresh, forked)
    assert forked.returncode == fresh.returncode == 7


def test_torchrun_standalone_gives_the_ranks_torchrun_s_environment(tmp_path):
    """Catches an emulated torchrun launch missing a variable torchrun sets (or setting one it
    does not): the trainer's launch store, LOCAL_WORLD_SIZE and the restart count read them."""
    script = tmp_path / "seen.py"
    script.write_text(SEEN)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", str(script)]  # fmt: skip
    seen = {"fresh": tmp_path / "fresh", "forked": tmp_path / "forked"}
    for folder in seen.values():
        folder.mkdir()
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    kw = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    fresh = subprocess.run(argv, env=dict(environment, SEEN_DIR=str(seen["fresh"])), **kw)
    forked = rank_pool.run(argv, env=dict(environment, SEEN_DIR=str(seen["forked"])), **kw)
    assert fresh.returncode == forked.returncode == 0, (fresh.stderr, forked.stderr)

    def ranks(folder) -> list[dict]:
        import json

        found = sorted(folder.iterdir())
        assert [f.name for f in found] == ["0.json", "1.json"], found
        ranks = [json.loads(f.read_text()) for f in found]
        for s in ranks:
            assert all(s["env"].pop(k) for k in VARYING), s
        return ranks

    assert ranks(seen["forked"]) == ranks(seen["fresh"])


def test_a_failed_rank_stops_the_others_and_fails_the_launch(tmp_path):
    """Catches a launch that waits for the surviving ranks of a failed one (torchrun stops them
    and exits 1): the test would hang until its time-out instead of failing."""
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\nif os.environ['RANK'] == '1': sys.exit(3)\n"
                      "time.sleep(600)\n")  # fmt: skip
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", str(script)]  # fmt: skip
    proc = rank_pool.run(argv, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120,
                         capture_output=True)  # fmt: skip
    assert proc.returncode == 1


def test_a_hung_launch_is_killed_at_its_time_out(tmp_path):
    """Catches a hung rank outliving its test: the pool would gather them and later tests
    would share the cores (and the ports) with it."""
    proc = rank_pool.popen([sys.executable, "-c", "pass"], dict(os.environ))
    assert isinstance(proc, subprocess.Popen)  # `-c` is not a module or a script: fresh
    proc.communicate(timeout=60)
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(600)\n")
    hung = rank_pool.popen([sys.executable, str(script)], dict(os.environ, OMP_NUM_THREADS="1"))
    assert isinstance(hung, rank_pool.Popen)
    with pytest.raises(subprocess.TimeoutExpired):
        hung.communicate(timeout=2)
    with pytest.raises(ProcessLookupError):
        os.kill(hung.pid, 0)


def test_a_killed_rank_reports_its_signal_and_a_killed_pool_is_replaced(tmp_path):
    """Catches a rank's death by signal read as success, and a dead zygote failing every later
    launch instead of one."""
    script = tmp_path / "die.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    assert rank_pool.run([sys.executable, str(script)], env=env).returncode == -signal.SIGKILL
    zygote = rank_pool._pool()
    zygote.proc.kill()
    zygote.proc.wait()
    again = rank_pool.run([sys.executable, str(script)], env=env)
    assert again.returncode == -signal.SIGKILL
