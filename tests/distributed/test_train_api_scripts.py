"""``shardwise.Trainer`` from a Python script (scripts/trainer_api.py): a model the script
builds, datasets in memory in each form people hand a trainer (token tensors, (inputs, targets)
pairs, an iterable dataset, a Hugging Face ``datasets.Dataset`` of ``input_ids`` for a
transformers GPT-2), trained by 2 processes (token tensors under FSDP, pairs and the iterable
dataset under DDP, GPT-2 under ZeRO-3, its tensor-parallel plan and a 2-stage pipeline) against
1 process on the same global batches: the losses and eval losses agree to 1e-5 (fp32). A run
resumed from its step-3 checkpoint continues with the uninterrupted run's losses."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import rank_pool
from train_runs import copy_until, losses, records

SCRIPT = Path(__file__).resolve().parent / "scripts" / "trainer_api.py"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_from_python.py"
CASES = [
    ("tensors", "fsdp"), ("pairs", "ddp"), ("iterable", "ddp"), ("hf", "zero3"), ("hf", "tp"),
    ("hf", "pipeline"),
]  # fmt: skip


def _train(out: Path, nproc: int, form: str, strategy: str) -> tuple[list[dict], dict]:
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    command = [*launcher, str(SCRIPT), "--form", form, "--strategy", strategy, "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = rank_pool.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return records(out), json.loads((out / "result.json").read_text())


def _close(ours: dict, theirs: dict, rel: float = 1e-5) -> None:
    assert sorted(ours) == sorted(theirs), (ours, theirs)
    for step, value in theirs.items():
        assert abs(ours[step] - value) <= rel * abs(value), (step, ours, theirs)


@pytest.mark.parametrize(("form", "strategy"), CASES)
def test_two_processes_train_as_one_on_a_dataset_in_memory(tmp_path, form, strategy):
    """Catches: ranks starting from different weights (each seeds its own; rank 0's must win),
    a data split that is not the one-process global batch (the BatchOrder rule, or an iterable
    dataset's positions), an item form read wrongly (a shift missed or applied twice), the eval
    dataset not reaching val_loss, and a strategy that does not run over a given module."""
    one, one_result = _train(tmp_path / "one", 1, form, strategy)
    two, two_result = _train(tmp_path / "two", 2, form, strategy)
    assert len(one) == 6 and [r["step"] for r in two] == list(range(1, 7))
    _close(losses(two), losses(one))
    evals = {r["step"]: r["val_loss"] for r in one if "val_loss" in r}
    assert sorted(evals) == [3, 6]
    _close({r["step"]: r["val_loss"] for r in two if "val_loss" in r}, evals)
    assert one[0]["loss"] > one[-1]["loss"]  # it learns
    assert Path(two_result["safetensors"]).exists()


def test_a_resumed_run_continues_with_the_next_batches(tmp_path):
    """Catches a dataset position not saved with the checkpoint (the resumed steps would read
    the first batches again) and rank 0's weights broadcast over the resumed ones."""
    full, _ = _train(tmp_path / "full", 2, "tensors", "ddp")
    resumed_dir = tmp_path / "resumed"
    copy_until(tmp_path / "full", resumed_dir, 3)
    resumed, _ = _train(resumed_dir, 2, "tensors", "ddp")
    steps = [r["step"] for r in resumed]
    assert steps == [4, 5, 6], steps
    _close(losses(resumed), {s: v for s, v in losses(full).items() if s > 3}, rel=1e-6)


def test_the_python_example_trains_under_zero3(tmp_path):
    """Catches examples/train_from_python.py breaking (the docs' example of the API): its own
    transformer on 2 processes under ZeRO-3, the eval loss reported, the weights written."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(EXAMPLE), "--strategy", "zero", "--steps", "8",
               "--out", str(tmp_path / "out")]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = rank_pool.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-6000:]
    first, last = records(tmp_path / "out")[0], records(tmp_path / "out")[-1]
    assert last["step"] == 8 and last["loss"] < first["loss"] and "val_loss" in last
    assert (tmp_path / "out" / "model.safetensors").exists()
