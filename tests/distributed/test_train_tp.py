"""``shardwise-train`` with tensor parallelism, end to end (torchrun): every example
mesh against the run it must equal (tp changes the arithmetic's order, not the result), the
safetensors export gathered from tp shards, and checkpoints that move between a tp layout and a
plain one in both directions."""

from __future__ import annotations

import pytest
import rank_pool
from train_runs import assert_continues, command, copy_until, losses, run, train

COMMON = ("training.max_steps=8", "training.checkpoint.every_steps=4")


def _run(name: str, nproc: int, *overrides: str, config: str = "ddp.yaml"):
    return run(name, nproc, config, *COMMON, "training.checkpoint.keep_last=5", *overrides)


def _ddp(world: int):
    """The plain run a tp layout must reproduce: DDP on `world` data ranks."""
    return _run(f"ddp_ref{world}", world)


# ZeRO over a sequence-parallel tp model whose column layers keep their gathered inputs
ZERO_TP = (
    'model.mesh_shape=[[2,2],["dp","tp"]]',
    "distributed.world_size=4",
    "distributed.sequence_parallel=true",
    "distributed.sequence_parallel_save_gathered=true",
)
PIPE = "pipeline_1f1b.yaml"  # 4 microbatches of 2: the same 16 sequences a step as ddp.yaml
MESHES = {
    # name: (processes, config, overrides, (reference processes, reference config))
    "tp2": (2, "ddp.yaml", ('model.mesh_shape=[[1,2],["fsdp","tp"]]',), (1, "ddp.yaml")),
    "fsdp2": (
        2,
        "ddp.yaml",
        ('model.mesh_shape=[[2,1],["fsdp","tp"]]', "distributed.strategy=fsdp"),
        (2, "ddp.yaml"),
    ),
    "fsdp2_x_tp2_sp": (
        4,
        "ddp.yaml",
        (
            'model.mesh_shape=[[2,2],["fsdp","tp"]]',
            "distributed.strategy=fsdp",
            "distributed.sequence_parallel=true",
        ),
        (2, "ddp.yaml"),
    ),
    # pipeline stages holding tp layers, the tied embedding/head across them, cut by time
    # (rank 0 times a tp copy alone)
    "pp2_x_tp2": (
        4,
        PIPE,
        (
            'model.mesh_shape=[[2,2],["pp","tp"]]',
            "distributed.world_size=4",
            "distributed.pipeline.split=time",
        ),
        (2, PIPE),
    ),
    # 3-D: 8 processes (about 30 s here), against one process
    "dp2_x_pp2_x_tp2": (
        8,
        PIPE,
        ('model.mesh_shape=[[2,2,2],["dp","pp","tp"]]', "distributed.world_size=8"),
        (1, "ddp.yaml"),
    ),
    # 3-D with FSDP-sharded pipeline stages of tp layers, against one process
    "fsdp2_x_pp2_x_tp2": (
        8,
        PIPE,
        ('model.mesh_shape=[[2,2,2],["fsdp","pp","tp"]]', "distributed.world_size=8"),
        (1, "ddp.yaml"),
    ),
    # ZeRO over the data axis of a tp model (its norm counts replicated parameters once)
    "dp2_x_tp2_zero2": (4, "zero2.yaml", ZERO_TP, (2, "zero2.yaml")),
    "dp2_x_tp2_zero3": (
        4,
        "zero2.yaml",
        (*ZERO_TP, "distributed.zero.zero_optimization.stage=3"),
        (2, "zero2.yaml"),
    ),
    # not tp, but a 2-D data mesh: it runs as hybrid sharding (it used to run as full sharding)
    "dp2_x_fsdp2_hybrid": (
        4,
        "ddp.yaml",
        (
            'model.mesh_shape=[[2,2],["dp","fsdp"]]',
            "distributed.strategy=fsdp",
            "distributed.fsdp.fsdp_sharding_strategy=hybrid_shard",
        ),
        (4, "ddp.yaml"),
    ),
}


def _reference(name: str):
    nproc, config = MESHES[name][3]
    if config == "ddp.yaml":
        return _ddp(nproc)
    return _run(f"{config}_ref{nproc}", nproc, config=config)


def _mesh_run(name: str):
    nproc, config, overrides, _ = MESHES[name]
    return _run(name, nproc, *overrides, config=config)


@pytest.mark.parametrize("name", list(MESHES))
def test_each_example_mesh_matches_plain_data_parallel(name):
    """[[1,2]], [[2,1]] and [[2,2]] (with sequence parallelism) against DDP over the same data
    ranks, [[2,2],["pp","tp"]] against the 2-stage pipeline, [[2,2,2],["dp"|"fsdp","pp","tp"]]
    against one process, ZeRO-2/3 over the dp axis of a tp model against ZeRO without tp: a tp
    layer that drops a reduction, TP ranks reading different batches, a clip norm that counts
    replicated parameters twice or misses the other rank's shards (or another stage's), a head
    that loses its tp forward when a stage copies it, all change the losses (clipping at 1.0 is
    active in these runs); the export loads into the plain GPT."""
    _, ref, _ = _reference(name)
    out, recs, log = _mesh_run(name)
    assert sorted(losses(recs)) == list(range(1, 9)), log[-2000:]
    for step, loss in losses(recs).items():
        assert abs(loss - losses(ref)[step]) <= 1e-5 * losses(ref)[step], (step, recs, ref)
    for ours, theirs in zip(recs, ref, strict=True):
        assert abs(ours["grad_norm"] - theirs["grad_norm"]) <= 1e-4 * theirs["grad_norm"]
    from safetensors.torch import load_file
    from shardwise.models import GPT, PRESETS

    GPT(PRESETS["tiny"]).load_state_dict(load_file(out / "model.safetensors"), strict=True)


def test_tp_run_exports_the_full_model():
    """The safetensors file of a tp run holds full tensors, gathered in the right order: the
    plain GPT loads it strictly, and every tensor equals the DDP run's."""
    from safetensors.torch import load_file
    from shardwise.models import GPT, PRESETS

    out, _, log = _mesh_run("fsdp2_x_tp2_sp")
    state = load_file(out / "model.safetensors")
    GPT(PRESETS["tiny"]).load_state_dict(state, strict=True)
    ref_out, _, _ = _ddp(2)
    ref_state = load_file(ref_out / "model.safetensors")
    # Shards gathered out of order differ by O(1); the runs themselves differ by rounding, which
    # AdamW amplifies most in the attention key bias (its gradient is rounding noise: softmax
    # is invariant to it), hence 1e-3.
    for name, tensor in ref_state.items():
        err = ((state[name] - tensor).norm() / tensor.norm().clamp_min(1e-12)).item()
        assert err <= 1e-3, f"{name}: relative difference {err:.2e} from the DDP run"


@pytest.mark.parametrize(
    "saved,loaded",
    [("fsdp2_x_tp2_sp", "ddp2"), ("ddp2", "fsdp2_x_tp2_sp")],
)
def test_checkpoint_moves_between_tp_and_plain_layouts(tmp_path, saved, loaded):
    """A checkpoint of the fsdp x tp run resumes as plain DDP and the other way round; the next
    losses equal the saving run's. A tp piece written at the wrong full-tensor offset (the
    row-parallel weights' strided runs, the fused QKV's three parts) or a lost moment breaks it."""
    src, ref, _ = _mesh_run(saved) if saved != "ddp2" else _ddp(2)
    out = tmp_path / "moved"
    copy_until(src, out, 4)
    nproc, overrides = (2, ()) if loaded == "ddp2" else (MESHES[loaded][0], MESHES[loaded][2])
    recs, log = train(nproc, "ddp.yaml", out, *COMMON, *overrides)
    assert_continues(recs, ref, [5, 6, 7, 8], 1e-5)


def test_zero_tp_checkpoint_resumes_at_its_tp_size_only(tmp_path):
    """A ZeRO x tp checkpoint (pieces of tp shards, tagged with their tp rank) resumes on the
    same mesh with the saving run's next losses (a rank loading another tp rank's pieces breaks
    them); at tp 1 it is refused with the fix instead of loading shards as whole tensors."""
    src, ref, _ = _mesh_run("dp2_x_tp2_zero2")
    out = tmp_path / "same"
    copy_until(src, out, 4)
    recs, _ = train(4, "zero2.yaml", out, *COMMON, *ZERO_TP)
    assert_continues(recs, ref, [5, 6, 7, 8], 1e-5)
    out = tmp_path / "other"
    copy_until(src, out, 4)
    proc = rank_pool.run(
        command(2, "zero2.yaml", out, *COMMON),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "tensor-parallel size 2 cannot resume at tp size 1" in proc.stdout + proc.stderr
    assert "resume with tp=2" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "name,row_name",
    [("tp2", "ddp"), ("fsdp2_x_tp2_sp", "zero3"), ("dp2_x_tp2_zero2", "zero2")],
)
def test_planner_counts_tp_shards(name, row_name):
    """The planner's per-rank parameters + gradients + AdamW state for a tp run (the split
    model's parameters per tp rank, then DDP or FSDP over the data axis) against the tensor
    storages each rank holds after its first step, within 2% (a parameter counted as split but
    replicated, or the tied head counted twice, breaks it)."""
    from shardwise.models import PRESETS
    from shardwise.train import planner

    _, recs, _ = _mesh_run(name)
    nproc, data_ranks = MESHES[name][0], MESHES[name][3][0]
    measured = max(recs[0]["model_state_bytes_per_rank"])
    params = planner.gpt_tp_parameters(PRESETS["tiny"], nproc // data_ranks)
    row = planner.plan(params, data_ranks, 2**40, mixed_precision="fp32").row(row_name)
    predicted = row.parameters + row.gradients + row.optimizer_state
    assert abs(measured - predicted) <= 0.02 * predicted, (name, measured, predicted)


def test_hybrid_mesh_shards_within_the_fsdp_axis():
    """[[2,2],["dp","fsdp"]] holds half the model state per rank (2 shards), not a quarter (full
    sharding over 4 ranks, what the config used to run silently)."""
    from shardwise.models import PRESETS
    from shardwise.train import planner

    _, recs, _ = _mesh_run("dp2_x_fsdp2_hybrid")
    measured = max(recs[0]["model_state_bytes_per_rank"])
    row = planner.plan(PRESETS["tiny"].num_parameters(), 2, 2**40, mixed_precision="fp32")
    predicted = sum(getattr(row.row("zero3"), k) for k in ("parameters", "gradients"))
    predicted += row.row("zero3").optimizer_state
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)


FP16 = {
    "ddp": (2, "ddp.yaml", ()),
    "fsdp2_x_tp2": (
        4,
        "ddp.yaml",
        ('model.mesh_shape=[[2,2],["fsdp","tp"]]', "distributed.strategy=fsdp"),
    ),
    "pipeline": (2, PIPE, ()),
    "zero2_x_tp2": (4, "zero2.yaml", ZERO_TP),
}


@pytest.mark.parametrize("name", list(FP16))
def test_fp16_loss_scaling_for_every_strategy(name):
    """fp16 outside ZeRO: started at 2**24 the scale overflows, so the first steps are skipped
    (grad_norm inf) and the scale halves on every rank at once (a rank that skipped alone would
    desynchronize its replicas or hang the pipeline); then the loss falls as in bf16."""
    nproc, config, overrides = FP16[name]
    _, recs, log = run(
        f"fp16_{name}",
        nproc,
        config,
        "training.mixed_precision=fp16",
        "training.initial_loss_scale_power=24",
        "training.max_steps=24",
        "training.micro_batch_size=4",
        *overrides,
    )
    scales = [r["loss_scale"] for r in recs]
    assert scales[0] == 2.0**24 and min(scales) < 2.0**20, scales
    skipped = [r["step"] for r in recs if r["grad_norm"] == float("inf")]
    assert skipped[0] == 1 and len(skipped) < 16, skipped
    for before, after in zip(recs[:-1], recs[1:], strict=True):  # overflows never raise it
        if before["grad_norm"] == float("inf"):
            assert after["loss_scale"] <= before["loss_scale"], scales
    first = sum(r["loss"] for r in recs[:3]) / 3
    last = sum(r["loss"] for r in recs[-3:]) / 3
    assert last < first - 1.0, (first, last, log[-1500:])


def test_fp16_resume_keeps_the_loss_scale(tmp_path):
    """A resumed fp16 run goes on with the GradScaler's state from the checkpoint: the same
    scales and losses as the run that never stopped. One that restarted at the initial 2**24
    would overflow again, skip steps the original took and log other scales."""
    overrides = (
        "training.mixed_precision=fp16",
        "training.initial_loss_scale_power=24",
        "training.max_steps=12",
        "training.checkpoint.every_steps=6",
        "training.micro_batch_size=4",
    )
    src, ref, _ = run("fp16_resume", 2, "ddp.yaml", *overrides)
    assert ref[5]["loss_scale"] < 2.0**24  # the scale has come down by the checkpoint
    out = tmp_path / "resumed"
    copy_until(src, out, 6)
    recs, _ = train(2, "ddp.yaml", out, *overrides)
    assert_continues(recs, ref, list(range(7, 13)), 1e-5)
    assert [r["loss_scale"] for r in recs] == [r["loss_scale"] for r in ref[6:]]
