"""training.deterministic with a pipeline: the same bits at every pipeline and data-parallel
degree as the unpipelined deterministic run. The tiny GPT (its embedding tied to the head across
the first and last stage) trains 8 steps with a global batch of 4 micro-batches of 2 rows; each
pipeline run cuts its rows into ``distributed.pipeline.num_microbatches`` of 2 rows, so micro-batch
``m`` holds the same rows in every run. The exported safetensors are SHA-256 identical to DDP's at
world 1 and every step's loss is equal."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from train_runs import copy_until, losses, run, train, val_losses

STEPS = ("training.max_steps=8", "training.eval_every=4", "training.checkpoint.every_steps=4",
         "training.deterministic=true")  # fmt: skip
PIPELINE = ("distributed.strategy=pipeline",)


def _pp(stages: int, replicas: int, microbatches: int, *more: str) -> tuple[str, ...]:
    """``stages`` × ``replicas`` ranks, ``microbatches`` of 2 rows per pipeline step, and the
    accumulation that makes the global batch 4 micro-batches."""
    accumulation = 4 // (replicas * microbatches)
    return (*PIPELINE, f'model.mesh_shape=[[{replicas},{stages}],["dp","pp"]]',
            f"distributed.pipeline.num_microbatches={microbatches}",
            "training.micro_batch_size=2",
            f"training.gradient_accumulation_steps={accumulation}", *more)  # fmt: skip


DROPOUT = ("model.dropout=0.1", "training.gradient_checkpointing=true")
BF16 = ("training.mixed_precision=bf16",)
CASES = {  # name: (world, overrides, the reference's overrides)
    "pp1": (1, _pp(1, 1, 4), ()),
    "pp1_dp2": (2, _pp(1, 2, 2), ()),
    "pp2": (2, _pp(2, 1, 4), ()),
    "pp2_accumulation_checkpointing": (2, _pp(2, 1, 2, "training.gradient_checkpointing=true"), ()),
    "pp2_dp2_gloo": (4, _pp(2, 2, 2, "distributed.backend=gloo"), ()),
    "pp4": (4, _pp(4, 1, 4), ()),
    "pp2_interleaved": (
        2,
        _pp(
            2,
            1,
            4,
            "distributed.pipeline.schedule=interleaved_1f1b",
            "distributed.pipeline.virtual_stages=2",
        ),
        (),
    ),  # fmt: skip
    # dropout: seeded by (step, micro-batch, block), so a stage starting mid-model draws alike
    "pp2_dropout_checkpointing": (2, _pp(2, 1, 4, *DROPOUT), DROPOUT),
    "pp2_dp2_dropout": (4, _pp(2, 2, 2, *DROPOUT), DROPOUT),
    # bf16 autocast: the stages' fp32 boundary changes no bit of what the blocks compute
    "pp2_bf16": (2, _pp(2, 1, 4, *BF16), BF16),
}


def _digest(out: Path) -> str:
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def _reference(*more: str) -> tuple[Path, list[dict]]:
    out, recs, _ = run(f"detpp_ref_{'_'.join(more)}", 1, "ddp.yaml", *STEPS,
                       "training.micro_batch_size=2", "training.gradient_accumulation_steps=4",
                       *more)  # fmt: skip
    return out, recs


@pytest.mark.parametrize("name", CASES)
def test_every_pipeline_degree_gives_the_bits_of_one_process(name):
    """Catches autograd's running += over a stage's microbatches (schedule order instead of the
    tree), the tied embedding's two copies summed after their trees instead of per micro-batch,
    the replicas averaged by a ring (or divided after the sum), a loss divided by the local
    microbatch count, a clip norm summed in float over the stages, dropout seeded where a
    stage starts instead of per block, and an eval loss averaged per pipeline step."""
    world, overrides, reference = CASES[name]
    ref_out, ref = _reference(*reference)
    out, recs, _ = run(f"detpp_{name}", world, "ddp.yaml", *STEPS, *overrides)
    assert len(ref) == 8 and len(val_losses(ref)) == 2
    assert losses(recs) == losses(ref)
    assert val_losses(recs) == val_losses(ref)
    assert _digest(out) == _digest(ref_out)


def test_without_the_mode_the_pipeline_degree_shows():
    """The control: the 2-stage pipeline without training.deterministic ends with other bits
    than the deterministic reference, so the comparison above can fail."""
    ref_out, _ = _reference()
    on = "training.deterministic=true"
    out, _, _ = run("detpp_off", 2, "ddp.yaml", *(s for s in STEPS if s != on), *_pp(2, 1, 4))
    assert _digest(out) != _digest(ref_out)


def test_a_pipeline_run_resumed_without_the_pipeline_continues_bit_for_bit(tmp_path):
    """Saved by a 2-stage pipeline after 4 steps, resumed as DDP on one process: the same bits
    as the uninterrupted reference. Catches a checkpoint that keeps the tied head's copy apart
    from the embedding, or optimizer state keyed by the stage's local names."""
    ref_out, ref = _reference()
    out, _, _ = run("detpp_resume_src", 2, "ddp.yaml", *STEPS, *_pp(2, 1, 4))
    resumed = tmp_path / "resumed"
    copy_until(out, resumed, 4)
    recs, log = train(1, "ddp.yaml", resumed, *STEPS, "training.micro_batch_size=2",
                      "training.gradient_accumulation_steps=4")  # fmt: skip
    assert "resumed from" in log, log[-3000:]
    assert losses(recs) == {s: v for s, v in losses(ref).items() if s > 4}
    assert _digest(resumed) == _digest(ref_out)
