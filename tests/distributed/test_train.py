"""``shardwise-train`` end to end: real multi-process runs (torchrun) of the bundled GPT on the
bundled corpus for each strategy, the planner against the bytes training holds, SIGTERM and
resume, checkpoints loaded at another world size, and a corrupted checkpoint. Each run is small
(the ``tiny`` GPT, fp32 unless said, a few steps) and reused by several tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import rank_pool
import torch
from train_runs import (
    BASE,
    CONFIGS,
    ROOT,
    command,
    losses,
    records,
    run,
    train,
)

INTERLEAVED = (
    "distributed.pipeline.schedule=interleaved_1f1b",
    "distributed.pipeline.virtual_stages=2",
)
STRATEGIES = {
    # name: (processes, config, overrides, planner row)
    "ddp": (2, "ddp.yaml", ("training.gradient_accumulation_steps=1",), "ddp"),
    "fsdp": (
        2,
        "fsdp.yaml",
        (
            "training.profile_communication=true",
            "training.profile={wait: 2, warmup: 1, active: 2}",
        ),
        "zero3",
    ),
    "zero2": (2, "zero2.yaml", ("training.mixed_precision=bf16",), "zero2"),
    "zero3": (2, "zero2.yaml", ("distributed.zero.zero_optimization.stage=3",), "zero3"),
    "pipeline_1f1b": (2, "pipeline_1f1b.yaml", (), "pipeline"),
    "dp_x_pp": (4, "dp_x_pp.yaml", ("training.gradient_accumulation_steps=1",), "pipeline"),
    # two virtual stages a rank: the export gathers stage s from pp rank s mod 2
    "pipeline_interleaved": (2, "pipeline_1f1b.yaml", INTERLEAVED, None),
    # ZB-H1 with the cut timed on rank 0 and broadcast (ranks cutting differently would hang)
    "pipeline_zb_h1_time_split": (
        2,
        "pipeline_1f1b.yaml",
        ("distributed.pipeline.schedule=zb_h1", "distributed.pipeline.split=time"),
        None,
    ),
}


def strategy_overrides(name: str) -> tuple[str, ...]:
    _, config, overrides, _ = STRATEGIES[name]
    common = (
        "training.max_steps=24",
        "training.micro_batch_size=4",
        "model.preset=tiny",
        "training.eval_every=8",
    )
    if config == "fsdp.yaml":
        common += ("training.gradient_checkpointing=false",)
    return (*common, *overrides)


def strategy_run(name: str):
    nproc, config, _, _ = STRATEGIES[name]
    return run(name, nproc, config, *strategy_overrides(name))


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_strategy_trains_and_exports(name):
    """Each strategy end to end: the loss falls on real text (a broken gradient sync, a
    mis-scaled loss or a wrong data shard shows as a flat or diverging loss), a checkpoint and a
    safetensors file that plain torch loads into the plain GPT (a name or shape mismatch of a
    gathered full state dict fails the strict load); the console gives the planner's predicted
    step at the start and the measured one beside it at the end."""
    from safetensors.torch import load_file
    from shardwise.models import GPT, PRESETS

    out, recs, log = strategy_run(name)
    assert [r["step"] for r in recs] == list(range(1, 25)), log[-2000:]
    first = sum(r["loss"] for r in recs[:3]) / 3
    last = sum(r["loss"] for r in recs[-3:]) / 3
    assert first > 5.0 and last < first - 1.5, (first, last)
    state = load_file(out / "model.safetensors")
    GPT(PRESETS["tiny"]).load_state_dict(state, strict=True)
    assert (out / "checkpoints" / "step-00000024" / "manifest.json").exists()
    assert "sample:" in log
    console = (out / "console.log").read_text()  # what the console showed, in the run folder
    assert "step 24 loss" in console and "sample:" in console, console[-2000:]
    assert "predicted step (" in console and "step time: predicted" in console, console[-2000:]


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_eval_loss_is_the_exported_models_loss_on_the_validation_batches(name):
    """The eval loss (issue 17) every training.eval_every steps and at the end: at step 24 it
    equals the exported model's mean loss, computed in one process, over the same validation
    windows (the first 4 global batches in order). Catches eval batches read from the training
    split or sharded wrongly over the data ranks, a pipeline evaluation that averages the wrong
    stage's loss or leaves gradients behind, and dropout or no-grad mode leaking into training."""
    from safetensors.torch import load_file
    from shardwise.models import GPT
    from shardwise.train import data
    from shardwise.train.config import load_config

    out, recs, _ = strategy_run(name)
    assert [r["step"] for r in recs if "val_loss" in r] == [8, 16, 24]
    nproc, config, _, _ = STRATEGIES[name]
    env = {"WORLD_SIZE": str(nproc), "RANK": "0", "LOCAL_RANK": "0"}
    overrides = [*BASE, *strategy_overrides(name)]
    cfg = load_config(str(CONFIGS / config), overrides, env=env, cuda_devices=0)
    rows = cfg.training.micro_batch_size * cfg.data_parallel_size  # one eval batch, all ranks
    if cfg.distributed.strategy == "pipeline":
        rows *= cfg.distributed.pipeline.num_microbatches
    gpt = cfg.gpt_config()
    model = GPT(gpt)
    model.load_state_dict(load_file(out / "model.safetensors"))
    stream = data.TokenStream(data.corpus_splits()[1], gpt.seq_len, rows, 0, 1, 0, shuffle=False)
    bf16 = cfg.mixed_precision == "bf16"
    n = min(4, stream.batches_per_epoch)
    batches = [stream.batch(0, i) for i in range(n)]
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        ref = sum(model.cross_entropy(model(x), y).item() for x, y in batches) / n
    got = recs[-1]["val_loss"]
    assert abs(got - ref) <= (1e-2 if bf16 else 1e-5) * ref, (got, ref)


def test_a_deepspeed_json_config_trains_with_its_scheduler():
    """Hugging Face's ds_config_zero2.json as the zero block (issue 17): its "auto" values come
    from the training section, its WarmupLR sets the lr of every step (the trainer's own schedule
    must yield to it, as DeepSpeed's first step uses iteration -1's lr), its CPU optimizer
    offload runs, and the loss falls."""
    from shardwise import _C

    ds = ROOT / "tests" / "data" / "deepspeed" / "hf_transformers_ds_config_zero2.json"
    _, recs, log = run(
        "deepspeed_json", 2, "zero2.yaml", "training.max_steps=16", "training.micro_batch_size=4",
        "model.preset=tiny", "training.warmup_steps=6", "training.learning_rate=3e-3",
        f"distributed.zero={ds}",
    )  # fmt: skip
    assert [r["step"] for r in recs] == list(range(1, 17)), log[-2000:]
    assert "accepted but ignored" in log and "steps_per_print" in log
    schedule = _C.WarmupSchedule(
        {"type": "WarmupLR", "warmup_min_lr": 0.0, "warmup_max_lr": 3e-3, "warmup_num_steps": 6}
    )
    for r in recs:
        assert abs(r["lr"] - schedule.lr(r["step"] - 2)) <= 1e-12, (r["step"], r["lr"])
    assert sum(r["loss"] for r in recs[-3:]) < sum(r["loss"] for r in recs[:3]) - 1.0


@pytest.mark.parametrize("name", [n for n, v in STRATEGIES.items() if v[3] is not None])
def test_planner_matches_the_bytes_training_holds(name):
    """The planner's per-rank parameters + gradients + optimizer state against the tensor
    storages each rank of the run holds after its first step, within 10% (a wrong formula for a
    strategy, or an engine keeping an extra copy, breaks it)."""
    from shardwise.models import PRESETS
    from shardwise.train import planner

    nproc, _, overrides, row_name = STRATEGIES[name]
    _, recs, _ = strategy_run(name)
    measured = max(recs[0]["model_state_bytes_per_rank"])
    precision = "bf16" if "training.mixed_precision=bf16" in overrides else "fp32"
    stages = 2 if "pipeline" in row_name else 1
    plan = planner.plan(
        PRESETS["tiny"].num_parameters(),
        nproc,
        2**40,
        mixed_precision=precision,
        pipeline_stages=stages,
        largest_stage_params=lambda p: planner.gpt_largest_stage_params(PRESETS["tiny"], p),
    )
    row = plan.row(row_name)
    predicted = row.parameters + row.gradients + row.optimizer_state
    assert abs(measured - predicted) <= 0.10 * predicted, (name, measured, predicted)


def test_plot_renders_the_run(tmp_path):
    """shardwise-plot: loss, throughput and cost (device-hours) PNGs from a run's
    metrics.jsonl."""
    out, _, _ = strategy_run("ddp")
    proc = rank_pool.run(
        [sys.executable, "-m", "shardwise.train.plot", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("loss.png", "throughput.png", "cost.png"):
        assert (out / name).stat().st_size > 5000


def single_process(*args: str) -> subprocess.CompletedProcess:
    """``python -m shardwise.train --config ddp.yaml ARGS`` in this process's environment."""
    return rank_pool.run(
        [sys.executable, "-m", "shardwise.train", "--config", str(CONFIGS / "ddp.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bad_config_is_refused_before_any_work(tmp_path):
    """A typo'd key and a mesh that does not match the world: exit code 2 with the key named
    and the fix, before a process group exists."""
    proc = single_process("training.micro_batch_sze=4")
    assert proc.returncode == 2
    assert "training.micro_batch_size" in proc.stderr, proc.stderr
    proc = single_process(
        "model.mesh_shape=[[2,1],[fsdp,tp]]", f"training.checkpoint.dir={tmp_path}"
    )
    assert proc.returncode == 2
    assert "mesh_shape" in proc.stderr and "world" in proc.stderr, proc.stderr


def test_a_run_that_cannot_fit_is_refused(tmp_path):
    """The planner's verdict: the 1B preset with micro-batches of 64 on one process of this
    machine is refused (exit 3) with the per-rank estimate, before the model is built."""
    proc = single_process(
        "model.preset=1b", "training.micro_batch_size=64", f"training.checkpoint.dir={tmp_path}"
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "refusing a run that will not fit" in proc.stderr and "GiB" in proc.stderr


def test_a_nanogpt_bin_folder_trains_exactly_as_the_same_tokens_in_memory(tmp_path):
    """Your own pre-tokenized data (issue 17): the bundled corpus's bytes written as nanoGPT's
    train.bin/val.bin (uint16, memory-mapped) give the fsdp run's losses and eval losses exactly.
    Catches ids widened with sign or from the wrong offset, val.bin ignored, or the stream
    reading a memory-mapped file differently from a tensor."""
    from shardwise.train import data

    train_ids, val_ids = data.corpus_splits()
    train_ids.numpy().astype("uint16").tofile(tmp_path / "train.bin")
    val_ids.numpy().astype("uint16").tofile(tmp_path / "val.bin")
    _, ref, _ = strategy_run("fsdp")
    nproc, config, _, _ = STRATEGIES["fsdp"]
    overrides = (*strategy_overrides("fsdp"), f"data.path={tmp_path}")
    recs, log = train(nproc, config, tmp_path / "run", *overrides)
    assert [r["step"] for r in recs] == [r["step"] for r in ref], log[-2000:]
    for ours, theirs in zip(recs, ref, strict=True):
        assert ours["loss"] == theirs["loss"], (ours["step"], ours["loss"], theirs["loss"])
        assert ours.get("val_loss") == theirs.get("val_loss"), ours["step"]


def test_a_jsonl_dataset_with_a_tokenizer_json_trains(tmp_path):
    """A Hugging Face-style dataset (jsonl, "text" column) tokenized by a tokenizer.json: the
    vocabulary comes from the tokenizer (400 -> 448 rows in the exported embedding), a separate
    val file gives the eval loss, the loss falls, and the sample is decoded by that tokenizer
    (its ByteLevel decoder yields plain text, not byte soup)."""
    from safetensors.torch import load_file
    from shardwise.train import data

    text = data.load_corpus()
    docs = [text[i : i + 2000] for i in range(0, 400_000, 2000)]
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs[:-20])
    with open(tmp_path / "val.jsonl", "w") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in docs[-20:])
    tokenizer = ROOT / "tests" / "data" / "tokenizers" / "bpe400" / "tokenizer.json"
    recs, log = train(
        2, "ddp.yaml", tmp_path / "run", "training.max_steps=20", "training.eval_every=10",
        f"data.path={tmp_path / 'train.jsonl'}", f"data.val_path={tmp_path / 'val.jsonl'}",
        f"data.tokenizer={tokenizer}",
    )  # fmt: skip
    assert load_file(tmp_path / "run" / "model.safetensors")["embed.weight"].shape[0] == 448
    assert [r["step"] for r in recs if "val_loss" in r] == [10, 20]
    assert sum(r["loss"] for r in recs[-3:]) < sum(r["loss"] for r in recs[:3]) - 0.5
    sample = log.split("sample:")[1]
    assert "\ufffd" not in sample and "Ġ" not in sample, sample


def test_processes_launched_by_hand_with_distributed_train_as_torchrun_does(tmp_path):
    """``python train.py --distributed``: two processes started without torchrun,
    each told its rank, the world size and the master in the config, give the torchrun run's
    losses exactly (the trainer used to ignore those keys and start two one-rank jobs)."""
    import socket

    _, ref, _ = strategy_run("fsdp")
    nproc, config, _, _ = STRATEGIES["fsdp"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "by-hand"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
           "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}  # fmt: skip
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = [
        subprocess.Popen(
            [
                *command(1, config, out, *strategy_overrides("fsdp")),
                "--distributed",
                "distributed.world_size=2",
                f"distributed.rank={rank}",
                f"distributed.local_rank={rank}",
                "distributed.master_addr=127.0.0.1",
                f"distributed.master_port={port}",
            ],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in range(2)
    ]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "world 2" in logs[0], logs[0][-2000:]
    assert losses(records(out)) == losses(ref)


def test_sync_gradients_every_reduces_midway_with_the_same_result(tmp_path):
    """training.sync_gradients_every=2 of 4 accumulated micro-batches: FSDP reduces
    after micro-batches 2 and 4 instead of 4 only (which ones: test_train_cli's sync_points), and
    the losses are the same (a second reduce-scatter that overwrote the first's shard instead of
    adding to it, or gradients left unsharded after it, would change them)."""
    common = (
        "training.max_steps=6",
        "training.micro_batch_size=2",
        "training.gradient_accumulation_steps=4",
        "training.gradient_checkpointing=false",
    )
    once, _ = train(2, "fsdp.yaml", tmp_path / "once", *common)
    twice, log = train(
        2, "fsdp.yaml", tmp_path / "twice", *common, "training.sync_gradients_every=2"
    )
    assert [r["step"] for r in twice] == list(range(1, 7)), log[-2000:]
    for a, b in zip(once, twice, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * a["loss"], (a["step"], a["loss"], b["loss"])


def test_metrics_measure_each_rank_its_phases_and_its_communication():
    """Per-rank tokens/s measured on each rank (it was the total divided by the world size), the
    phases of the step, and training.profile_communication's per-step operations of the shardwise
    backend: FSDP's reduce-scatters per step carry exactly this rank's half of the
    gradients (each of the 3 units' shards padded to the world size), once per unit."""
    from shardwise.models import GPT, PRESETS

    out, recs, _ = strategy_run("fsdp")
    last = recs[-1]
    assert len(last["tokens_per_s_by_rank"]) == 2 and min(last["tokens_per_s_by_rank"]) > 0
    assert sum(last["tokens_per_s_by_rank"]) >= last["tokens_per_s"] * 0.999
    for phase in ("data", "forward", "backward", "optimizer"):
        assert len(last["phase_s_per_rank"][phase]) == 2 and last[f"{phase}_s"] >= 0
    # each rank's phases fit in its step, and every step in the slowest (step_s); the slowest
    # forward and the slowest backward may be two ranks', so their sum may exceed step_s
    phases = last["phase_s_per_rank"]
    for rank in range(2):
        assert phases["forward"][rank] + phases["backward"][rank] <= last["step_s"] * 1.01, rank
    rs = last["communication"]["reduce_scatter"]
    half = sum(p.numel() for p in GPT(PRESETS["tiny"]).parameters()) * 4 / 2
    assert rs["calls"] == 3 and half <= rs["bytes"] <= half + 3 * 4, rs
    assert last["communication"]["all_gather"]["calls"] >= 3
    assert "step 24 communication (rank 0): all_gather" in (out / "console.log").read_text()


def test_profile_writes_a_chrome_trace_per_rank_with_the_collectives_named():
    """training.profile={wait: 2, warmup: 1, active: 2}: one Chrome trace per rank of steps 4-5,
    valid JSON, holding the FSDP engine's collectives under the shardwise backend's names."""
    out, _, _ = strategy_run("fsdp")
    for rank in (0, 1):
        traces = sorted((out / "profile").glob(f"rank{rank}-step*.json"))
        assert len(traces) == 1, traces
        names = {e.get("name") for e in json.loads(traces[0].read_text())["traceEvents"]}
        assert {"shardwise:_allgather_base", "shardwise:_reduce_scatter_base"} <= names, sorted(
            n for n in names if n and n.startswith("shardwise")
        )


def test_training_mixed_precision_sets_the_collectives_dtype():
    """training.mixed_precision=bf16 means bf16 communication where the guides say so, counted by
    training.profile_communication on the last step: FSDP all-gathers bf16 parameters (half the
    bytes of fsdp_mixed_precision=false, which keeps fp32 parameters under autocast) and
    reduce-scatters fp32 gradients (fsdp_reduce_dtype's default); DDP with
    distributed.ddp_comm_hook=bf16 all-reduces its gradients in half the bytes. Catches
    mixed precision meaning autocast only, every collective left in fp32."""
    from shardwise.models import GPT, PRESETS

    def last_step(name, config, *overrides):
        common = ("training.max_steps=2", "training.profile_communication=true")
        _, recs, _ = run(name, 2, config, "model.preset=tiny", *common, *overrides)
        return recs[-1]["communication"]

    fsdp = ("training.mixed_precision=bf16",)
    bf16 = last_step("mp_fsdp_bf16", "fsdp.yaml", *fsdp)
    fp32 = last_step("mp_fsdp_fp32", "fsdp.yaml", *fsdp, "distributed.fsdp_mixed_precision=false")
    assert 2 * bf16["all_gather"]["bytes"] == fp32["all_gather"]["bytes"], (bf16, fp32)
    calls_and_bytes = [
        {k: c["reduce_scatter"][k] for k in ("calls", "bytes")} for c in (bf16, fp32)
    ]
    assert calls_and_bytes[0] == calls_and_bytes[1], (bf16, fp32)
    ddp = ("training.gradient_accumulation_steps=1",)
    plain = last_step("mp_ddp_fp32", "ddp.yaml", *ddp)["all_reduce"]["bytes"]
    hooked = last_step("mp_ddp_bf16", "ddp.yaml", *ddp, "distributed.ddp_comm_hook=bf16")
    grads = sum(p.numel() for p in GPT(PRESETS["tiny"]).parameters())
    assert plain - hooked["all_reduce"]["bytes"] == 2 * grads, (plain, hooked)


def test_fsdp_state_dict_type_decides_what_the_trainer_exports():
    """distributed.fsdp_state_dict_type=sharded_state_dict: no model.safetensors (nothing
    gathered on rank 0) but model-sharded/, each rank's pieces with a manifest, which
    load_sharded_model reads into the plain GPT: bit for bit the full_state_dict export of the
    same run. Catches the key parsed and the full model exported regardless."""
    from safetensors.torch import load_file
    from shardwise.models import GPT, PRESETS
    from shardwise.train import checkpoint as ckpt

    same = ("model.preset=tiny", "training.max_steps=3", "training.mixed_precision=no")
    full, _, _ = run("export_full", 2, "fsdp.yaml", *same)
    sharded, _, log = run(
        "export_sharded",
        2,
        "fsdp.yaml",
        *same,
        "distributed.fsdp_state_dict_type=sharded_state_dict",
    )
    assert not (sharded / "model.safetensors").exists(), log[-2000:]
    assert len(list((sharded / ckpt.SHARDED_EXPORT).glob("*/rank*"))) == 2, log[-2000:]
    model = GPT(PRESETS["tiny"])
    ckpt.load_sharded_model(sharded / ckpt.SHARDED_EXPORT, model)
    expected = load_file(full / "model.safetensors")
    state = model.state_dict()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name
