"""training.deterministic: the same bits at every data-parallel size. The tiny GPT (DDP; FSDP
full_shard, shard_grad_op and hybrid_shard; ZeRO 1, 2 and 3; fp32 and bf16; activation
checkpointing and dropout; the shardwise backend and gloo) and a Llama from its transformers
config train 8 steps with a global batch of 4 micro-batches at world 1, 2 and 4 (accumulation 4,
2, 1); the exported safetensors are SHA-256 identical and every step's loss is equal. A run
saved at world 4 after 4 steps and resumed at world 2 ends as the uninterrupted runs. Without
the mode the same runs differ (so the comparison can fail)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from train_runs import copy_until, losses, run, train, val_losses

STEPS = ("training.max_steps=8", "training.micro_batch_size=2", "training.eval_every=4",
         "training.checkpoint.every_steps=4")  # fmt: skip
MICRO_BATCHES = 4  # per global batch (8 at world 8)
# 8 processes on a CI machine's 2 cores take minutes: `make test-all` runs them
ALL = pytest.mark.skipif(not os.environ.get("SHARDWISE_TEST_ALL"), reason="make test-all")
FSDP = ("distributed.strategy=fsdp",)
HYBRID = (*FSDP, "distributed.fsdp.fsdp_sharding_strategy=hybrid_shard")


def _zero(stage: int) -> tuple[str, ...]:
    return ("distributed.strategy=zero", f"distributed.zero.zero_optimization.stage={stage}")


CASES = {  # name: (config, overrides, {world: more overrides})
    "ddp": ("ddp.yaml", (), {}),
    # dropout: the masks seeded by (step, micro-batch), recomputed alike under checkpointing
    "ddp_dropout_checkpointing_gloo": (
        "ddp.yaml",
        ("model.dropout=0.1", "training.gradient_checkpointing=true", "distributed.backend=gloo"),
        {},
    ),  # fmt: skip
    "fsdp": ("ddp.yaml", FSDP, {}),
    "fsdp_shard_grad_op_bf16": (
        "ddp.yaml",
        (
            *FSDP,
            "training.mixed_precision=bf16",
            "distributed.fsdp.fsdp_sharding_strategy=shard_grad_op",
        ),
        {},
    ),
    "fsdp_hybrid_gloo": (
        "ddp.yaml",
        ("distributed.backend=gloo",),
        {  # world 1: plain FSDP
            1: FSDP,
            2: (*HYBRID, 'model.mesh_shape=[[2,1],["dp","fsdp"]]'),
            4: (*HYBRID, 'model.mesh_shape=[[2,2],["dp","fsdp"]]'),
        },
    ),  # fmt: skip
    "zero1": ("ddp.yaml", _zero(1), {}),
    "zero2_bf16": ("ddp.yaml", (*_zero(2), "training.mixed_precision=bf16"), {}),
    "zero3_gloo": ("ddp.yaml", (*_zero(3), "distributed.backend=gloo"), {}),
    "hf_llama": ("hf_llama.yaml", ("distributed.strategy=ddp", "data.seq_len=32"), {}),
}


def _deterministic(name: str, world: int, *extra: str) -> tuple[Path, list[dict]]:
    config, overrides, by_world = CASES[name]
    layout = by_world.get(world, FSDP if by_world else ())
    out, recs, _ = run(f"det_{name}_{world}_{len(extra)}", world, config, *STEPS, *overrides,
                       *layout, "training.deterministic=true", _accumulation(world),
                       *extra)  # fmt: skip
    return out, recs


def _accumulation(world: int) -> str:
    return f"training.gradient_accumulation_steps={MICRO_BATCHES // world}"


def _digest(out: Path) -> str:
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize("name", CASES)
def test_every_world_size_gives_the_same_bits(name):
    """Catches a gradient sum whose association depends on the world size (DDP's buckets, a
    ring all-reduce, autograd's running += over the accumulation), micro-batches whose samples
    depend on it (the strided split), a loss divided by the local micro-batch count, dropout
    seeded by rank, a reported loss averaged in rank order, and an eval loss over a number of
    windows that grows with the world (eval_batches global batches of micro_batch x W)."""
    runs = {w: _deterministic(name, w) for w in (1, 2, 4)}
    reference_out, reference = runs[1]
    assert len(reference) == 8 and len(val_losses(reference)) == 2
    for world, (out, recs) in runs.items():
        assert _digest(out) == _digest(reference_out), f"world {world}"
        assert losses(recs) == losses(reference), f"world {world}"
        assert val_losses(recs) == val_losses(reference), f"world {world}"


def test_every_strategy_gives_the_same_bits():
    """In fp32 the strategies share the tree, the exact clip norm and the elementwise update:
    FSDP (full, hybrid) and ZeRO 1 and 3 at every world equal DDP. Catches an engine's reduction
    or clip that is deterministic but not the tree's (a pre-divide, a float norm over shards,
    stage 1's running sum over micro-batches)."""
    ddp = _digest(_deterministic("ddp", 1)[0])
    for name in ("fsdp", "fsdp_hybrid_gloo", "zero1", "zero3_gloo"):
        for world in (1, 2, 4):
            assert _digest(_deterministic(name, world)[0]) == ddp, (name, world)


@ALL
@pytest.mark.parametrize("name", ["ddp", "fsdp", "zero2_bf16"])
def test_world_8_gives_the_bits_of_world_1(name):
    """8 data ranks, accumulation 1, against one rank accumulating all 8 micro-batches: a
    tree three levels deep over the ranks. Catches an association that holds for 2 and 4 ranks
    only (a fixed pairing instead of recursive halving)."""
    one, _ = _deterministic(name, 1, "training.gradient_accumulation_steps=8")
    eight, _ = _deterministic(name, 8, "training.gradient_accumulation_steps=1")
    assert _digest(eight) == _digest(one)


def test_an_epoch_ends_on_the_same_window_at_every_world_size(tmp_path):
    """A corpus of 44 windows holds 5 steps of 8 (4 dropped), so steps 6 to 8 read epoch 1.
    Catches an epoch that drops per global batch of ``micro_batch × W`` windows (none at world
    1, 4 at world 4): epoch 1 would start at another window and the runs part after step 5."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(bytes(range(32, 127)) * 9 + b"x" * 45)  # 900 bytes, 720 train tokens
    small = (f"data.path={corpus}", "data.seq_len=16", "data.val_fraction=0.2")
    digests = set()
    for world in (1, 4):
        out, recs, _ = run(f"det_epoch_{world}", world, "ddp.yaml", *STEPS, *small,
                           "training.deterministic=true", _accumulation(world))  # fmt: skip
        assert len(recs) == 8
        digests.add(_digest(out))
    assert len(digests) == 1


def test_without_the_mode_the_world_size_shows():
    """The control: the same runs without training.deterministic differ between world 1 and 2,
    so the comparison above can fail."""
    outs = []
    for world in (1, 2):
        out, _, _ = run(f"nondet_{world}", world, "ddp.yaml", *STEPS, _accumulation(world))
        outs.append(_digest(out))
    assert outs[0] != outs[1]


def test_a_run_resumed_at_another_world_size_continues_bit_for_bit(tmp_path):
    """Catches a resumed stream position counted in the saved world's batches (the resumed run
    would read other windows), state loaded with a layout of the saved world, and RNG state
    carried per rank instead of derived from (step, micro-batch)."""
    full_out, full = _deterministic("ddp", 4)
    resumed_dir = tmp_path / "resumed"
    copy_until(full_out, resumed_dir, 4)
    config, overrides, _ = CASES["ddp"]
    recs, log = train(2, config, resumed_dir, *STEPS, *overrides, "training.deterministic=true",
                      _accumulation(2))  # fmt: skip
    assert "resumed from" in log, log[-3000:]
    assert sorted(losses(recs)) == [5, 6, 7, 8]
    assert losses(recs) == {s: v for s, v in losses(full).items() if s > 4}
    assert _digest(resumed_dir) == _digest(full_out) == _digest(_deterministic("ddp", 1)[0])
    shutil.rmtree(resumed_dir)
