"""shardwise-train's checkpoints under failure: a sharded checkpoint loaded at another world
size, one rank's checkpoint on two, a corrupted file skipped for the previous checkpoint,
SIGTERM and Ctrl-C saving and stopping, and a pipeline's checkpoint resumed as DDP: each resume
continues with the uninterrupted run's losses."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from train_runs import (
    assert_continues,
    command,
    copy_until,
    losses,
    records,
    run,
    script,
    train,
)


def _fsdp_reference(world: int = 2):
    """8 FSDP steps with checkpoints at 4 and 8, global batch 8 at any world size."""
    return run(
        f"fsdp_ref{world}",
        world,
        "fsdp.yaml",
        "training.max_steps=8",
        "training.checkpoint.every_steps=4",
        "training.checkpoint.keep_last=5",
        f"training.micro_batch_size={8 // world}",
    )


@pytest.mark.parametrize("saved,loaded", [(2, 1), (4, 2), (2, 4)])
def test_sharded_checkpoint_loads_at_another_world_size(tmp_path, saved, loaded):
    """2 → 1, 4 → 2 and 2 → 4 ranks (the same global batch of 8): the FSDP shards saved by one
    world are cut differently from the ones loading them; a piece copied to the wrong offset or
    a lost optimizer moment changes the next losses, which must equal the saving run's."""
    src, ref, _ = _fsdp_reference(saved)
    out = tmp_path / "resharded"
    copy_until(src, out, 4)
    recs, log = train(
        loaded,
        "fsdp.yaml",
        out,
        "training.max_steps=8",
        "training.checkpoint.every_steps=4",
        f"training.micro_batch_size={8 // loaded}",
    )
    assert f"saved by {saved} ranks" in log, log[-2000:]
    assert_continues(recs, ref, [5, 6, 7, 8], 1e-5)


def test_checkpoint_of_one_rank_loads_on_two(tmp_path):
    """1 → 2 ranks: a single-process run's checkpoint resumed by two processes continues
    with the single-process losses."""
    src = tmp_path / "one"
    ref, _ = train(
        1,
        "fsdp.yaml",
        src,
        "training.max_steps=6",
        "training.checkpoint.every_steps=3",
        "training.micro_batch_size=8",
    )
    out = tmp_path / "two"
    copy_until(src, out, 3)
    recs, log = train(
        2,
        "fsdp.yaml",
        out,
        "training.max_steps=6",
        "training.checkpoint.every_steps=3",
        "training.micro_batch_size=4",
    )
    assert "saved by 1 ranks" in log, log[-2000:]
    assert_continues(recs, ref, [4, 5, 6], 1e-5)


def test_corrupted_checkpoint_falls_back_to_the_previous(tmp_path):
    """A flipped byte in the newest checkpoint: it is reported (file and reason) and the run
    resumes from the one before, with the reference run's losses from there."""
    src, ref, _ = _fsdp_reference()
    out = tmp_path / "corrupt"
    copy_until(src, out, 8)
    victim = out / "checkpoints" / "step-00000008" / "rank-00001.pt"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    recs, log = train(
        2,
        "fsdp.yaml",
        out,
        "training.max_steps=8",
        "training.checkpoint.every_steps=4",
        "training.micro_batch_size=4",
    )
    assert "rank-00001.pt" in log and "sha-256 mismatch" in log.lower(), log[-3000:]
    assert "step-00000004" in log
    assert_continues(recs, ref, [5, 6, 7, 8], 1e-6)


def interrupted(nproc: int, out: Path, steps, signum, after: int) -> tuple[int, str]:
    """Runs ddp.yaml, sends ``signum`` to the launcher once ``after`` steps are logged, and
    waits: (exit code, output)."""
    proc = subprocess.Popen(
        command(nproc, "ddp.yaml", out, *steps),
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        cwd=out.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(records(out)) < after and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signum)
    log = proc.communicate(timeout=120)[0]
    return proc.returncode, log


def test_sigterm_saves_and_resume_continues_exactly(tmp_path):
    """Preemption: SIGTERM to the launcher mid-run makes every rank finish its step, save and
    exit; the resumed run's losses equal an uninterrupted run's (RNG, data position, optimizer
    moments and step count all restored; any one missing changes them)."""
    steps = ("training.max_steps=150", "training.checkpoint.every_steps=1000")
    ref, _ = train(2, "ddp.yaml", tmp_path / "ref", *steps)
    out = tmp_path / "killed"
    _, log = interrupted(2, out, steps, signal.SIGTERM, after=5)
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert saved and "SIGTERM" in log, log[-3000:]
    stopped = int(saved[-1].name.split("-")[1])
    assert 5 <= stopped < 150, stopped
    recs, _ = train(2, "ddp.yaml", out, *steps)
    ours, theirs = losses(recs), losses(ref)
    assert set(range(stopped + 1, 151)) <= set(ours)
    for step in range(stopped + 1, 151):
        assert ours[step] == pytest.approx(theirs[step], rel=1e-6), step


def test_ctrl_c_saves_and_stops_like_sigterm(tmp_path):
    """Catches (issue 17): SIGINT (Ctrl-C) killing a run with a traceback and no checkpoint,
    where SIGTERM saves and stops; the note also lands in the run folder's console.log."""
    out = tmp_path / "interrupted"
    steps = ("training.max_steps=500", "training.checkpoint.every_steps=1000")
    returncode, log = interrupted(1, out, steps, signal.SIGINT, after=3)
    assert returncode == 0, log[-3000:]
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert saved and "SIGINT: saved step" in log, log[-3000:]
    assert "SIGINT: saved step" in (out / "console.log").read_text()


def test_pipeline_checkpoint_resumes_as_ddp_on_one_process(tmp_path):
    """Pieces are named as in the plain GPT, whatever cut the model: a 2-stage pipeline's
    checkpoint (the tied embedding saved once, its head copy refilled from it) resumes as DDP
    in one process with the same global batch, and continues with the pipeline's losses."""
    src = tmp_path / "pipe"
    common = ("training.max_steps=8", "training.checkpoint.every_steps=4")
    ref, _ = train(2, "pipeline_1f1b.yaml", src, *common, "training.micro_batch_size=2")
    out = tmp_path / "ddp"
    copy_until(src, out, 4)
    recs, log = train(
        1,
        "ddp.yaml",
        out,
        *common,
        "training.micro_batch_size=8",
        "training.gradient_accumulation_steps=1",
        "training.lr_scaling=none",  # ddp.yaml scales the rate; the pipeline's does not
    )
    assert "saved by 2 ranks" in log, log[-2000:]
    assert_continues(recs, ref, [5, 6, 7, 8], 1e-5)


@pytest.mark.parametrize("backend,saves", [("shardwise", "false"), ("gloo", "true")])
def test_killed_rank_restarts_by_itself_with_the_same_losses(tmp_path, backend, saves):
    """torchrun --max-restarts=1 and rank 1 killed (SIGKILL) after step 5 of the first launch:
    the job comes back by itself from step 4's checkpoint and ends with the uninterrupted run's
    losses, bit for bit (synchronous saves over shardwise, asynchronous ones over gloo). Catches
    a restarted group reading the failed launch's addresses from torchrun's store (gloo: a
    refused connection; shardwise: a hang), and a resume that loses the data position or a
    random stream."""
    steps = ("training.max_steps=8", "training.checkpoint.every_steps=2",
             "training.micro_batch_size=2", f"distributed.backend={backend}",
             f"training.checkpoint.async={saves}")  # fmt: skip
    ref, _ = train(2, "ddp.yaml", tmp_path / "uninterrupted", *steps)
    restarts = ("--max-restarts=1", "--monitor-interval=0.1")
    recs, log = train(2, "ddp.yaml", tmp_path / "killed", *steps, torchrun=restarts,
                      script=script("kill_rank_once.py", 1, 5))  # fmt: skip
    assert "exitcode  : -9" in log or "exitcode: -9" in log, log[-3000:]
    assert "torchrun restart 1 of 1" in log, log[-3000:]
    resumed = int(re.search(r"resumed from \S+ \(step (\d+),", log)[1])
    # step 4's save is complete when rank 1 dies if synchronous; an asynchronous one may not be
    assert resumed == 4 if saves == "false" else resumed in (2, 4), log[-3000:]
    redone = list(range(resumed + 1, 9))
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, *redone]
    assert losses(recs) == losses(ref)


def _two_agents(out: Path, *overrides: str, **kw) -> list[str]:
    """shardwise-train (or ``script``) as two torchrun agents of one process each, as on two
    nodes (c10d rendezvous, one restart allowed): the agents' outputs."""
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
             "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
             "--rdzv-id=restart", "--monitor-interval=0.1"]  # fmt: skip
    argv = [*agent, *command(1, "ddp.yaml", out, *overrides, **kw)[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    agents = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    logs = [a.communicate(timeout=240)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(logs)[-6000:]
    return logs


def test_killed_rank_of_a_two_node_job_restarts_it(tmp_path):
    """Two torchrun agents (two nodes of one process each, c10d rendezvous) and rank 1 killed
    after step 5: the job comes back from step 4 by itself with the uninterrupted two-node
    run's losses. Catches the restarted ranks reading the failed launch's addresses from the
    rendezvous store (gloo's connection refused) across agents, each of which counts its own
    restarts."""
    steps = ("training.max_steps=8", "training.checkpoint.every_steps=2",
             "training.micro_batch_size=2", "distributed.backend=gloo")  # fmt: skip
    _two_agents(tmp_path / "uninterrupted", *steps)
    logs = "".join(
        _two_agents(tmp_path / "killed", *steps, script=script("kill_rank_once.py", 1, 5))
    )
    assert "exitcode: -9" in logs and "resumed from" in logs, logs[-3000:]
    recs = records(tmp_path / "killed")
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 5, 6, 7, 8]
    assert losses(recs) == losses(records(tmp_path / "uninterrupted"))
