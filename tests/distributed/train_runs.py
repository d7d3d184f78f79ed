"""The runs the trainer's distributed tests share: ``shardwise-train`` launched under torchrun (or
as one process) on a bundled config with overrides, its metrics records and losses, and a run
cached by name so several tests read one run."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import sys
from pathlib import Path

import rank_pool

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
BASE = [
    "model.preset=tiny",
    "training.mixed_precision=no",
    "training.learning_rate=3e-3",
    "training.warmup_steps=2",
    "training.log_every=1",
]


def command(
    nproc: int | str,
    config: str,
    out: Path,
    *overrides: str,
    script: tuple[str, ...] = ("-m", "shardwise.train"),
    torchrun: tuple[str, ...] = (),
) -> list[str]:
    """One process (nproc 1) or torchrun's ``--nproc_per_node=nproc`` (a number or "auto") with
    ``torchrun``'s further options, running ``script`` (shardwise-train, or a script wrapping
    its ``cli.main`` and its arguments) on the config and overrides."""
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc != 1
        else [sys.executable]
    )
    return [
        *launcher,
        *torchrun,
        *script,
        "--config",
        str(CONFIGS / config),
        *BASE,
        f"training.checkpoint.dir={out}",
        *overrides,
    ]


def launch(
    nproc: int | str,
    config: str,
    out: Path,
    *overrides: str,
    timeout: int = 240,
    script: tuple[str, ...] = ("-m", "shardwise.train"),
    torchrun: tuple[str, ...] = (),
) -> tuple[int, list[dict], str]:
    """``command``'s run, ended or failed: (its exit status, rank 0's metrics records, the
    output)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = rank_pool.run(
        command(nproc, config, out, *overrides, script=script, torchrun=torchrun),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=out.parent,
    )
    return proc.returncode, records(out), proc.stdout + proc.stderr


def script(name: str, *args: object) -> tuple[str, ...]:
    """``command``'s ``script`` for tests/distributed/scripts/``name`` and its arguments."""
    return (str(ROOT / "tests" / "distributed" / "scripts" / name), *map(str, args))


def train(nproc: int | str, config: str, out: Path, *overrides: str, timeout: int = 240, **kw):
    """Runs to the end: (the metrics records of rank 0's metrics.jsonl, the output)."""
    code, recs, log = launch(nproc, config, out, *overrides, timeout=timeout, **kw)
    assert code == 0, f"exit {code}\n{log[-8000:]}"
    return recs, log


def records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses(recs: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in recs}


def val_losses(recs: list[dict]) -> dict[int, float]:
    return {r["step"]: r["val_loss"] for r in recs if "val_loss" in r}


def assert_continues(recs: list[dict], ref: list[dict], steps: list[int], rel: float) -> None:
    """The resumed run logged exactly ``steps``, each with the reference run's loss."""
    ours, theirs = losses(recs), losses(ref)
    assert sorted(ours) == steps, sorted(ours)
    for step in steps:
        assert abs(ours[step] - theirs[step]) <= rel * abs(theirs[step]), (step, ours, theirs)


@functools.cache
def runs_folder() -> Path:
    """This test process's folder of training runs (shared by the tests, so each run trains
    once), removed when the process exits: a whole `test-python` leaves about 450 MB in it."""
    base = Path(os.environ.get("SHARDWISE_TEST_TMP", "/tmp")) / f"shardwise-train-{os.getpid()}"
    base.mkdir(parents=True, exist_ok=True)
    owner = os.getpid()  # not a process forked from this one, which would share the handler

    def remove():
        if os.getpid() == owner:
            shutil.rmtree(base, ignore_errors=True)

    atexit.register(remove)
    return base


@functools.cache
def run(name: str, nproc: int | str, config: str, *overrides: str) -> tuple[Path, list[dict], str]:
    out = runs_folder() / name
    recs, log = train(nproc, config, out, *overrides)
    return out, recs, log


def copy_until(src: Path, dst: Path, step: int) -> None:
    """dst: a run directory holding src's checkpoints up to ``step``."""

    (dst / "checkpoints").mkdir(parents=True, exist_ok=True)
    for d in (src / "checkpoints").iterdir():
        if int(d.name.split("-")[1]) <= step:
            shutil.copytree(d, dst / "checkpoints" / d.name)


def with_import_changed(script: Path, old: str, new: str, folder: Path) -> Path:
    """A copy of ``script`` in ``folder`` with its one line ``old`` replaced by ``new``, and
    nothing else changed: a user's script moved to shardwise."""
    text = script.read_text()
    assert text.count(old) == 1, f"{script.name} holds {text.count(old)} lines {old!r}"
    path = folder / script.name
    path.write_text(text.replace(old, new))
    return path
