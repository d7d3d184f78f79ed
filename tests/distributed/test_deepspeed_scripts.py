"""A DeepSpeed training script as people write it (scripts/deepspeed_textbook.py), run twice at
world 2: by DeepSpeed itself (its CPU accelerator over gloo, under torchrun) and, with the one
line ``import deepspeed`` changed to ``import shardwise.deepspeed as deepspeed``, by shardwise
under ``shardwise-deepspeed --num_gpus 2`` (DeepSpeed's launch line). Each run trains 24
micro-batches, saves a checkpoint with client state after 16, and resumes from it in a fresh
engine; the losses, the resumed losses, the checkpoint's ``latest`` tag and the engine's
attributes must agree."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import rank_pool
from train_runs import with_import_changed

pytest.importorskip("deepspeed")

SCRIPTS = Path(__file__).resolve().parent / "scripts"
IMPORT = "import deepspeed\n"


def _config(tmp_path: Path, stage: int) -> Path:
    config = json.loads((SCRIPTS / "ds_config.json").read_text())
    config["zero_optimization"]["stage"] = stage
    path = tmp_path / f"ds_config_{stage}.json"
    path.write_text(json.dumps(config))
    return path


def _ours(tmp_path: Path) -> Path:
    """The script with its import changed, and nothing else."""
    return with_import_changed(
        SCRIPTS / "deepspeed_textbook.py",
        IMPORT,
        "import shardwise.deepspeed as deepspeed\n",
        tmp_path,
    )


def _run(command: list[str], out: Path, **env) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    proc = rank_pool.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_textbook_deepspeed_script_trains_as_under_deepspeed(tmp_path, stage):
    """Catches (each a way the script would break or drift with the import changed):
    add_config_arguments, init_distributed, the launcher's --local_rank, initialize(args=...)
    reading --deepspeed_config, the loader's order (DeepSpeed's shuffled DistributedSampler,
    iter() restarting the epoch), the ZeRO step (AdamW, clipping, WarmupLR, accumulation 2),
    save_checkpoint's tag and latest file, load_checkpoint's client state and a resume that
    does not continue exactly."""
    config = _config(tmp_path, stage)
    args = ["--deepspeed", "--deepspeed_config", str(config)]
    theirs = _run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(SCRIPTS / "deepspeed_textbook.py"), *args, "--out", str(tmp_path / "ds")],
        tmp_path / "ds", DS_ACCELERATOR="cpu",
    )  # fmt: skip
    ours = _run(
        [sys.executable, "-m", "shardwise.deepspeed_launcher", "--num_gpus", "2",
         str(_ours(tmp_path)), *args, "--out", str(tmp_path / "sw")],
        tmp_path / "sw",
    )  # fmt: skip
    for key in ("losses", "resumed"):
        a, b = ours[key], theirs[key]
        assert len(a) == len(b), (key, a, b)
        assert all(abs(x - y) <= 1e-5 * abs(y) for x, y in zip(a, b, strict=True)), (key, a, b)
    assert ours["resumed"] == ours["losses"][16:]  # the resume continues exactly
    same = ("latest", "loaded", "local_rank", "engine_local_rank", "world_size",
            "train_batch_size", "gradient_accumulation_steps", "global_steps", "lr")  # fmt: skip
    for key in same:
        assert ours[key] == theirs[key], (key, ours[key], theirs[key])
    assert ours["client"]["seen"] == theirs["client"]["seen"] == 16
    assert ours["loaded"] == ours["latest"] == "global_step8"
    assert ours["launched_with"] == 0 and theirs["launched_with"] == -1  # torchrun passes none


def _cifar_ours(tmp_path: Path) -> Path:
    """The CIFAR-style script with its two deepspeed imports changed, and nothing else."""
    changed = with_import_changed(
        SCRIPTS / "deepspeed_cifar.py",
        IMPORT,
        "import shardwise.deepspeed as deepspeed\n",
        tmp_path,
    )
    (tmp_path / "ours").mkdir()
    return with_import_changed(
        changed,
        "from deepspeed.accelerator import",
        "from shardwise.deepspeed.accelerator import",
        tmp_path / "ours",
    )


def _cifar(script: Path, out: Path, stage: int, dtype: str, **env) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(script), "--deepspeed", "--stage", str(stage),
               "--dtype", dtype, "--out", str(out)]  # fmt: skip
    return _run(command, out, **env)


@pytest.mark.parametrize("stage", [2, 3])
def test_the_cifar_example_trains_as_under_deepspeed(tmp_path, stage):
    """Catches what DeepSpeed's CIFAR-10 example leans on beyond the textbook script: a
    model_parameters filter (an iterator), the config passed as a dict beside args,
    get_accelerator().device_name(local_rank), bfloat16_enabled(), DeepSpeed's Adam (decoupled
    weight decay) under WarmupLR, and bf16 as DeepSpeed runs it (the module in bf16, fp32 master
    weights): fp32 losses within 1e-5 of DeepSpeed's, bf16 no further from DeepSpeed's fp32 run
    than twice DeepSpeed's own bf16 run is."""
    ours_script = _cifar_ours(tmp_path)
    runs = {}
    for dtype in ("fp32", "bf16"):
        runs["theirs", dtype] = _cifar(SCRIPTS / "deepspeed_cifar.py", tmp_path / f"ds-{dtype}",
                                       stage, dtype, DS_ACCELERATOR="cpu")  # fmt: skip
        runs["ours", dtype] = _cifar(ours_script, tmp_path / f"sw-{dtype}", stage, dtype)
    reference = runs["theirs", "fp32"]["losses"]
    ours = runs["ours", "fp32"]["losses"]
    assert len(ours) == len(reference) == 64
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(ours, reference, strict=True))
    for key in ("device", "global_steps", "lr", "bf16"):
        assert runs["ours", "fp32"][key] == runs["theirs", "fp32"][key], key
    assert runs["ours", "bf16"]["bf16"] and runs["theirs", "bf16"]["bf16"]

    def error(who):
        return max(abs(a - b) for a, b in zip(runs[who, "bf16"]["losses"], reference, strict=True))

    assert 0 < error("ours") <= 2 * error("theirs"), (error("ours"), error("theirs"))
