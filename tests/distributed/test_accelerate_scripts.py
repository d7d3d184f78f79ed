"""An Accelerate training script as people write it (scripts/accelerate_textbook.py: a BERT
classifier, bf16, gradient accumulation 4, save_state / load_state, save_model), run at world 2
by Accelerate itself (its CPU processes over gloo, under torchrun) and, with the one line
``from accelerate import Accelerator`` changed to ``from shardwise.accelerate import
Accelerator``, by shardwise: under torchrun (Accelerate's data-parallel path over the shardwise
backend) and under ``accelerate launch --config_file`` with an FSDP config (shardwise's FSDP,
built from Accelerate's FSDP plugin) and with DeepSpeed configs (shardwise's ZeRO stages 1-3
where Accelerate's DeepSpeed path calls DeepSpeed). Accelerate runs DeepSpeed on GPUs only, so
its reference here is its own data-parallel run, which ZeRO in fp32 equals up to the order of
the gradient sums."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import rank_pool
import torch
from train_runs import with_import_changed

pytest.importorskip("accelerate")

SCRIPTS = Path(__file__).resolve().parent / "scripts"
IMPORT = "from accelerate import Accelerator\n"
FSDP_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: '{precision}'
num_machines: 1
num_processes: 2
machine_rank: 0
rdzv_backend: static
same_network: true
use_cpu: false
fsdp_config:
  fsdp_version: 1
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_use_orig_params: true
"""


FSDP2_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: '{precision}'
num_machines: 1
num_processes: 2
machine_rank: 0
rdzv_backend: static
same_network: true
use_cpu: false
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
"""
DEEPSPEED_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  zero_stage: {stage}
  gradient_accumulation_steps: 4
  gradient_clipping: 1.0
  offload_optimizer_device: none
  offload_param_device: none
  zero3_save_16bit_model: true
mixed_precision: '{precision}'
num_machines: 1
num_processes: 2
machine_rank: 0
rdzv_backend: static
same_network: true
use_cpu: false
"""


def _ours(tmp_path: Path) -> Path:
    """The script with its import changed, and nothing else."""
    return with_import_changed(
        SCRIPTS / "accelerate_textbook.py",
        IMPORT,
        "from shardwise.accelerate import Accelerator\n",
        tmp_path,
    )


def _run(command: list[str], out: Path, reference: bool = False, **env_vars) -> dict:
    # as a user runs it: without pytest's variables
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env = dict(env, OMP_NUM_THREADS="1", **env_vars)
    proc = rank_pool.run(command, env=env, capture_output=True, text=True, timeout=400)
    log = proc.stdout + proc.stderr
    # Accelerate's own gloo run sometimes aborts at exit, after its results are written (gloo's
    # threads at teardown): the reference is taken then, nothing of ours is excused
    exit_abort = reference and "terminate called without an active exception" in log
    if not (exit_abort and (out / "result.json").exists()):
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads((out / "result.json").read_text())


def _torchrun(script: Path, out: Path, precision: str, reference=False, **env) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(script), "--out", str(out),
               "--mixed_precision", precision]  # fmt: skip
    return _run(command, out, reference, **env)


def _theirs(tmp_path: Path, precision: str) -> dict:
    return _torchrun(SCRIPTS / "accelerate_textbook.py", tmp_path / f"theirs-{precision}",
                     precision, reference=True, ACCELERATE_USE_CPU="true")  # fmt: skip


def test_the_script_runs_as_under_accelerate_over_the_shardwise_backend(tmp_path):
    """Catches: the shardwise process group not being the one Accelerate uses (its gathers and
    the loaders' RNG synchronization), CPU processes run as one (Accelerate without cpu=True;
    under torchrun and under ``accelerate launch --multi_gpu``),
    and any drift in accumulation, clipping, the scheduler, save_state or load_state: the same
    script gives Accelerate's losses bit for bit."""
    theirs = _theirs(tmp_path, "bf16")
    ours = _torchrun(_ours(tmp_path), tmp_path / "ours", "bf16")
    # accelerate launch --multi_gpu starts torchrun's processes, which train on the CPU here
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
               "--num_processes", "2", str(_ours(tmp_path)), "--out", str(tmp_path / "launch"),
               "--mixed_precision", "bf16"]  # fmt: skip
    launched = _run(command, tmp_path / "launch")
    for run in (ours, launched):
        assert run["backend"] == "shardwise" and theirs["backend"] == "gloo"
        assert run["distributed_type"] == theirs["distributed_type"] == "DistributedType.MULTI_CPU"
        for key in ("losses", "resumed", "accuracy", "resumed_accuracy", "lr", "state_files",
                    "model_files", "num_processes"):  # fmt: skip
            assert run[key] == theirs[key], (key, run[key], theirs[key])


def test_accelerate_launch_with_an_fsdp_config_trains_with_shardwise_fsdp(tmp_path):
    """Catches an FSDP config that is parsed and ignored (the plugin's wrap policy, sharding,
    mixed precision and state-dict type reach shardwise's wrapper), an optimizer state saved
    as rank 0's shards (load_state would hand rank 1 the wrong slices), and a run that does not
    train as Accelerate's DDP run: fp32 to 1e-5; bf16 (FSDP's bf16 parameters against DDP's
    autocast) no further from the fp32 run than twice Accelerate's own bf16 error."""
    config = tmp_path / "fsdp.yaml"
    results = {}
    for precision in ("no", "bf16"):
        config.write_text(FSDP_CONFIG.format(precision=precision))
        out = tmp_path / f"ours-fsdp-{precision}"
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(config), str(_ours(tmp_path)), "--out", str(out),
                   "--mixed_precision", precision]  # fmt: skip
        results[precision] = (_run(command, out), _theirs(tmp_path, precision))
    ours, theirs = results["no"]
    assert ours["distributed_type"] == "DistributedType.FSDP" and ours["backend"] == "shardwise"
    assert ours["state_files"] == theirs["state_files"]
    for key in ("losses", "resumed"):
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(ours[key], theirs[key], strict=True))
    reference = theirs["losses"] + theirs["resumed"]
    ours_bf16, theirs_bf16 = (r["losses"] + r["resumed"] for r in results["bf16"])

    def error(losses):
        return max(abs(a - b) for a, b in zip(losses, reference, strict=True))

    assert error(ours_bf16) <= 2 * error(theirs_bf16), (error(ours_bf16), error(theirs_bf16))


def _launch(config: Path, script: Path, out: Path, precision: str) -> dict:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(config), str(script), "--out", str(out),
               "--mixed_precision", precision]  # fmt: skip
    return _run(command, out)


def test_accelerate_launch_with_a_deepspeed_config_trains_with_shardwise_zero(tmp_path):
    """Catches a DeepSpeed config parsed and ignored (the stage, the accumulation Accelerate
    hands the engine, the clipping), the script's torch AdamW or its scheduler not driving the
    engine (a client optimizer whose lr the engine does not follow), Accelerate's accumulation
    boundary not reaching the engine, save_state / load_state not restoring the optimizer and
    the lr in effect, and save_model under stage 3 not gathering the shards: stages 1, 2 and 3
    in fp32 equal Accelerate's own data-parallel run within 1e-5, resumed losses included, with
    DeepSpeed's checkpoint layout in save_state's folder."""
    theirs = _theirs(tmp_path, "no")
    config = tmp_path / "deepspeed.yaml"
    for stage in (1, 2, 3):
        config.write_text(DEEPSPEED_CONFIG.format(stage=stage, precision="no"))
        ours = _launch(config, _ours(tmp_path), tmp_path / f"ours-zero{stage}", "no")
        assert ours["distributed_type"] == "DistributedType.DEEPSPEED", ours
        assert ours["backend"] == "shardwise" and ours["num_processes"] == 2
        for key in ("losses", "resumed"):
            pairs = zip(ours[key], theirs[key], strict=True)
            assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in pairs), (stage, key)
        assert ours["lr"] == theirs["lr"] and ours["model_files"] == theirs["model_files"]
        # Accelerate's DeepSpeed layout: the engine's checkpoint folder and its latest file
        assert "pytorch_model" in ours["state_files"] and "latest" in ours["state_files"]
        assert "optimizer.bin" not in ours["state_files"], ours["state_files"]


def test_accelerate_launch_with_deepspeed_bf16_runs_the_engine_in_bf16(tmp_path):
    """Catches the mixed precision given to the Accelerator not reaching the ZeRO engine (the
    DeepSpeed config's bf16 section, which Accelerate fills from it): the run differs from the
    fp32 one, and save_model writes the gathered stage-3 weights in bf16, as DeepSpeed's 16-bit
    save does. (bf16 against DeepSpeed itself: tests/distributed/test_deepspeed_scripts.py.)"""
    from safetensors.torch import load_file

    config = tmp_path / "deepspeed.yaml"
    runs = {}
    for precision in ("no", "bf16"):
        config.write_text(DEEPSPEED_CONFIG.format(stage=3, precision=precision))
        runs[precision] = _launch(config, _ours(tmp_path), tmp_path / precision, precision)
    assert runs["bf16"]["losses"] != runs["no"]["losses"]
    dtypes = {v.dtype for v in load_file(tmp_path / "bf16" / "model" / "model.safetensors").values()
              if v.is_floating_point()}  # fmt: skip
    assert dtypes == {torch.bfloat16}, dtypes
    assert all(abs(a - b) < 0.05 for a, b in zip(runs["bf16"]["losses"], runs["no"]["losses"],
                                                  strict=True))  # fmt: skip


def test_accelerate_launch_with_an_fsdp2_config_trains_with_shardwise_fully_shard(tmp_path):
    """Catches fsdp_version: 2 not reaching shardwise's fully_shard (the model not sharded), the
    optimizer left on parameters fully_shard did not shard (Accelerate's remapping), a gradient
    norm taken over this rank's shards only (torch's clip_grad_norm_ without DTensors), and
    save_state / load_state writing or reading this rank's slices of the model or the optimizer
    state: fp32 equals Accelerate's own data-parallel run within 1e-5, resumed losses included,
    with each rank holding half of the parameters; bf16 (the plugin's MixedPrecisionPolicy)
    changes the run. (The policy's numerics against torch's fully_shard:
    tests/distributed/fully_shard_checks.py.)"""
    theirs = _theirs(tmp_path, "no")
    config = tmp_path / "fsdp2.yaml"
    runs = {}
    for precision in ("no", "bf16"):
        config.write_text(FSDP2_CONFIG.format(precision=precision))
        runs[precision] = _launch(
            config, _ours(tmp_path), tmp_path / f"fsdp2-{precision}", precision
        )
    ours = runs["no"]
    assert ours["distributed_type"] == "DistributedType.FSDP" and ours["backend"] == "shardwise"
    assert ours["model_class"] == "FSDPBertForSequenceClassification", ours["model_class"]
    assert theirs["model_class"] == "DistributedDataParallel"
    assert 2 * ours["local_numel"] <= theirs["local_numel"] + 2, (ours["local_numel"], theirs)
    for key in ("losses", "resumed"):
        pairs = zip(ours[key], theirs[key], strict=True)
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in pairs), key
    for key in ("state_files", "model_files", "lr", "accuracy", "resumed_accuracy"):
        assert ours[key] == theirs[key], (key, ours[key], theirs[key])
    assert runs["bf16"]["losses"] != ours["losses"]
