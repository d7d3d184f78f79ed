"""``shardwise-train``'s keys change what a run does: one-process runs of the tiny GPT on the
bundled corpus (4 steps, about 5 s each), each differing from a base run in the keys under test,
compared by what the run leaves behind (its metrics records, exported weights, checkpoints and
profiler traces). Each test catches its key being parsed and then ignored: the run would equal
the base run where the test asserts a difference, or differ where it asserts equality."""

from __future__ import annotations

import json
import struct

import pytest
from train_runs import ROOT, losses, run

STEPS = 4
SOLO = (
    f"training.max_steps={STEPS}",
    "training.warmup_steps=1",
    "training.micro_batch_size=4",
    "training.gradient_accumulation_steps=1",
    "training.eval_every=2",
    "training.checkpoint.every_steps=25",
)


def solo(name: str, *overrides: str) -> tuple:
    """(run folder, metrics records) of a one-process run of ddp.yaml with these overrides."""
    out, recs, _ = run(f"keys_{name}", 1, "ddp.yaml", *SOLO, *overrides)
    return out, recs


def base():
    return solo("base")


def shapes(out) -> dict[str, list[int]]:
    """The exported model.safetensors' tensor shapes, read from its header."""
    raw = (out / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def test_the_base_run_is_reproducible_and_shuffle_seed_defaults_to_the_seed():
    """Every difference asserted below means something only if a run repeats exactly: the base
    run again with data.shuffle_seed set to training.seed (its documented default) logs the same
    losses bit for bit."""
    _, again = solo("shuffle_seed_0", "data.shuffle_seed=0")
    assert losses(again) == losses(base()[1])


def test_training_seed_initializes_the_model():
    """training.seed=1 with the batches kept in seed 0's order (data.shuffle_seed=0): the first
    loss differs, so the seed reaches the initialization, not only the data order."""
    _, recs = solo("seed_1", "training.seed=1", "data.shuffle_seed=0")
    assert losses(recs)[1] != losses(base()[1])[1]


def test_data_shuffle_seed_orders_the_batches():
    """data.shuffle_seed=1 with training.seed=0: the same initial model sees other batches, so
    the first loss differs; the validation batches are not shuffled, so the eval loss after
    two steps is still close to the base run's (both models trained two steps from one init)."""
    _, recs = solo("shuffle_seed_1", "data.shuffle_seed=1")
    ours, theirs = losses(recs), losses(base()[1])
    assert ours[1] != theirs[1]
    assert abs(recs[1]["val_loss"] - base()[1][1]["val_loss"]) < 0.1 * theirs[1]


def test_model_shape_keys_build_the_model_the_run_exports():
    """model.dim, layers, mlp_ratio, vocab_size and seq_len override the tiny preset (64, 2, 4,
    256, 64): the exported weights have exactly the overridden shapes, and each step trains on
    seq_len tokens a sequence (its tokens per second over its steps per second)."""
    out, recs = solo(
        "shape",
        "model.dim=32",
        "model.layers=3",
        "model.mlp_ratio=2",
        "model.vocab_size=300",
        "model.seq_len=32",
        "model.heads=2",
    )
    got = shapes(out)
    assert got["embed.weight"] == [300, 32] and got["head.weight"] == [300, 32]
    assert got["pos.weight"] == [32, 32]
    assert got["blocks.0.up.weight"] == [64, 32] and got["blocks.0.down.weight"] == [32, 64]
    assert {k.split(".")[1] for k in got if k.startswith("blocks.")} == {"0", "1", "2"}
    tokens = recs[-1]["tokens_per_s"] * recs[-1]["step_s"]
    assert abs(tokens - 4 * 32) < 1, tokens
    assert shapes(base()[0])["pos.weight"] == [64, 64]


def test_model_heads_splits_attention():
    """model.heads=2 instead of the preset's 4: the same weights (heads do not change a shape,
    and the seed is the same) give another first loss, because attention is split otherwise."""
    out, recs = solo("heads_2", "model.heads=2")
    assert shapes(out) == shapes(base()[0])
    assert losses(recs)[1] != losses(base()[1])[1]


def test_model_dropout_drops_in_training_only():
    """model.dropout=0.5: the training losses differ from the base run's from the first step;
    the eval loss is still finite and of the same order (dropout is off in evaluation)."""
    _, recs = solo("dropout", "model.dropout=0.5")
    assert losses(recs)[1] != losses(base()[1])[1]
    assert recs[1]["val_loss"] < 2 * base()[1][1]["val_loss"]


def test_gradient_accumulation_of_two_halves_equals_one_batch():
    """micro_batch_size=2 with gradient_accumulation_steps=2 reads the same windows as one
    micro-batch of 4 and averages the two halves' gradients: the losses equal the base run's to
    float rounding, while one micro-batch of 2 without accumulation does not."""
    acc = ("training.micro_batch_size=2", "training.gradient_accumulation_steps=2")
    _, accumulated = solo("accumulate", *acc)
    _, half = solo("half_batch", "training.micro_batch_size=2")
    ref = losses(base()[1])
    for step, loss in losses(accumulated).items():
        assert abs(loss - ref[step]) <= 1e-5 * ref[step], (step, loss, ref[step])
    assert losses(half)[2] != pytest.approx(ref[2], rel=1e-5)


@pytest.mark.parametrize(
    "overrides, factor",
    [
        (("training.lr_scaling=none",), 1.0),
        (("training.lr_scaling=linear",), 4 / 16),
        (("training.base_batch_size=4",), 1.0),
    ],
)
def test_lr_scaling_and_base_batch_size_set_the_logged_learning_rate(overrides, factor):
    """ddp.yaml scales the rate by sqrt(batch / base_batch_size) = sqrt(4 / 16); the logged rate
    of every step is learning_rate x the scaling's factor x the warm-up's."""
    _, recs = solo("lr_" + "_".join(o.split("=")[1] for o in overrides), *overrides)
    ref = {r["step"]: r["lr"] for r in base()[1]}
    for r in recs:
        assert r["lr"] == pytest.approx(ref[r["step"]] * factor / 0.5, rel=1e-12), (r, ref)


def test_gradient_clip_norm_bounds_the_update():
    """The base run clips at 1.0 and its gradient norm is above that; gradient_clip_norm=0 (no
    clipping) gives the same first loss and norm, then another second loss."""
    _, recs = solo("no_clip", "training.gradient_clip_norm=0")
    ref = base()[1]
    assert ref[0]["grad_norm"] > 1.0
    assert recs[0]["loss"] == ref[0]["loss"] and recs[0]["grad_norm"] == ref[0]["grad_norm"]
    assert recs[1]["loss"] != ref[1]["loss"]


def test_log_every_picks_the_logged_steps():
    """training.log_every=2: the metrics hold steps 2 and 4 only, with the base run's losses."""
    _, recs = solo("log_every_2", "training.log_every=2")
    assert [r["step"] for r in recs] == [2, 4]
    ref = losses(base()[1])
    assert all(ref[s] == loss for s, loss in losses(recs).items())


def test_eval_batches_sets_the_batches_evaluated():
    """training.eval_batches=1 instead of 4: the same training (losses bit for bit), another
    eval loss at step 2 (one validation batch instead of four)."""
    _, recs = solo("eval_batches_1", "training.eval_batches=1")
    ref = base()[1]
    assert losses(recs) == losses(ref)
    assert recs[1]["val_loss"] != ref[1]["val_loss"]


def test_checkpoint_keep_last_keeps_that_many():
    """Checkpoints every step with keep_last=2: only steps 3 and 4 remain (the default, 3,
    would leave 2, 3 and 4)."""
    out, _ = solo(
        "keep_last_2", "training.checkpoint.every_steps=1", "training.checkpoint.keep_last=2"
    )
    kept = sorted(d.name for d in (out / "checkpoints").iterdir())
    assert kept == ["step-00000003", "step-00000004"], kept


def trace(out, rank: int = 0) -> list[dict]:
    """The events of rank ``rank``'s Chrome trace of the run."""
    (path,) = (out / "profile").glob(f"rank{rank}-step*.json")
    return json.loads(path.read_text())["traceEvents"]


def profiled_steps(events) -> set[int]:
    return {
        int(e["name"].split("#")[1])
        for e in events
        if e.get("name", "").startswith("ProfilerStep#")
    }


def linears(events) -> int:
    return sum(e.get("name") == "aten::linear" for e in events)


# no evaluation inside the recorded step (the end's evaluation follows step 4)
PROFILE = ("training.profile={wait: 1, warmup: 1, active: 1}", "training.eval_every=0")


def test_profile_schedule_records_the_steps_it_names():
    """training.profile's wait, warmup and active pick the recorded steps: {1, 1, 1} records
    profiler step 2 only, {0, 1, 2} steps 1 and 2; record_shapes adds the operators' input
    shapes, absent without it."""
    one, _ = solo("profile_111", *PROFILE)
    shaped = "training.profile={wait: 0, warmup: 1, active: 2, record_shapes: true}"
    two, _ = solo("profile_012", shaped, "training.eval_every=0")
    assert profiled_steps(trace(one)) == {2}
    assert profiled_steps(trace(two)) == {1, 2}
    assert not any("Input Dims" in e.get("args", {}) for e in trace(one))
    assert any("Input Dims" in e.get("args", {}) for e in trace(two))


def test_gradient_checkpointing_recomputes_each_block_in_backward():
    """training.gradient_checkpointing=true: the profiled step runs every block's four linear
    layers twice (forward, then again in backward) and the head's once: 2 x 4 x layers + 1
    linears where the base run has 4 x layers + 1, with the same losses."""
    base_out, plain = solo("profile_111", *PROFILE)
    out, ckpt = solo("checkpointing", *PROFILE, "training.gradient_checkpointing=true")
    layers = 2
    assert linears(trace(base_out)) == 4 * layers + 1
    assert linears(trace(out)) == 2 * 4 * layers + 1
    for step, loss in losses(ckpt).items():
        assert loss == pytest.approx(losses(plain)[step], rel=1e-6)


# --------------------------------------------------------------------------- two processes

PAIR = (
    f"training.max_steps={STEPS}",
    "training.warmup_steps=1",
    "training.micro_batch_size=2",
    "training.eval_every=0",
)
COUNTED = "training.profile_communication=true"


def pair(name: str, *overrides: str, counted: bool = True) -> tuple:
    """(run folder, metrics records) of a two-process run of ddp.yaml (two accumulation
    micro-batches a step), by default with the last step's operations counted."""
    out, recs, _ = run(f"keys2_{name}", 2, "ddp.yaml", *PAIR, *(COUNTED,) * counted, *overrides)
    return out, recs


def calls(recs, op: str, field: str = "calls") -> int:
    return recs[-1]["communication"].get(op, {}).get(field, 0)


def test_sync_gradients_every_reduces_after_each_micro_batch():
    """ddp.yaml accumulates two micro-batches; sync_gradients_every=1 reduces after each, so the
    step all-reduces every gradient once more than the default (after the last only): exactly
    the model's fp32 gradient bytes more, in more calls."""
    from shardwise.models import GPT, PRESETS

    _, once = pair("ddp")
    _, twice = pair("sync_every_1", "training.sync_gradients_every=1")
    grads = 4 * sum(p.numel() for p in GPT(PRESETS["tiny"]).parameters())
    extra = calls(twice, "all_reduce", "bytes") - calls(once, "all_reduce", "bytes")
    assert extra == grads, (once[-1]["communication"], twice[-1]["communication"])
    assert calls(twice, "all_reduce") > calls(once, "all_reduce")


def test_distributed_backend_picks_the_process_groups_backend():
    """distributed.backend=gloo: the profiled step's collectives are gloo's (gloo:all_reduce),
    none of them shardwise's; the default run's are shardwise's."""
    prof = "training.profile={wait: 1, warmup: 1, active: 1}"
    gloo, _ = pair("gloo", prof, "distributed.backend=gloo", counted=False)
    ours, _ = pair("shardwise", prof, counted=False)

    def backends(out) -> set[str]:
        # "gloo:all_reduce", "shardwise:allreduce"; not the custom ops ("shardwise::fused_adamw_")
        names = (e.get("name", "") for e in trace(out))
        return {n.split(":")[0] for n in names if "::" not in n} & {"gloo", "shardwise", "nccl"}

    assert backends(gloo) == {"gloo"}
    assert backends(ours) == {"shardwise"}


def test_distributed_strategy_shards_the_model_state():
    """distributed.strategy=fsdp on ddp.yaml (no fsdp block, no mesh to infer it from): each
    rank holds about half of DDP's model state and the step all-gathers and reduce-scatters
    where DDP all-reduces."""
    _, ddp = pair("ddp")
    _, fsdp = pair("strategy_fsdp", "distributed.strategy=fsdp")
    full, half = ddp[0]["model_state_bytes_per_rank"][0], fsdp[0]["model_state_bytes_per_rank"][0]
    assert half < 0.6 * full, (half, full)
    assert calls(fsdp, "reduce_scatter") > 0 and calls(ddp, "reduce_scatter") == 0


TP2 = ("distributed.mesh_shape=[1, 2]", "distributed.mesh_axis_names=[fsdp, tp]")


def test_distributed_mesh_shape_lays_out_tensor_parallelism():
    """distributed.mesh_shape=[1, 2] with axis names [fsdp, tp] is model.mesh_shape's 2-way
    tensor parallelism: the same losses and per-rank state as the run given that way, and less
    state per rank than DDP's."""
    _, ours = pair("tp2_distributed_mesh", *TP2)
    _, theirs = pair("tp2_model_mesh", 'model.mesh_shape=[[1, 2], ["fsdp", "tp"]]')
    _, ddp = pair("ddp")
    assert losses(ours) == losses(theirs)
    state = [r[0]["model_state_bytes_per_rank"] for r in (ours, theirs, ddp)]
    assert state[0] == state[1] and state[0][0] < 0.75 * state[2][0], state


def test_sequence_parallel_reduce_scatters_and_saves_gathered_inputs():
    """Under 2-way tensor parallelism, sequence_parallel=true replaces the layers' all-reduces
    of activations with reduce-scatters and all-gathers (the all-reduced bytes fall to the
    replicated norms' gradients); sequence_parallel_save_gathered=true keeps each
    column-parallel layer's gathered input for backward, so backward gathers fewer times."""
    _, plain = pair("tp2_distributed_mesh", *TP2)
    _, sp = pair("tp2_sp", *TP2, "distributed.sequence_parallel=true")
    _, saved = pair(
        "tp2_sp_saved",
        *TP2,
        "distributed.sequence_parallel=true",
        "distributed.sequence_parallel_save_gathered=true",
    )
    assert calls(plain, "reduce_scatter") == 0 < calls(sp, "reduce_scatter")
    assert calls(sp, "all_reduce", "bytes") < calls(plain, "all_reduce", "bytes") / 10
    assert calls(saved, "all_gather") < calls(sp, "all_gather"), (sp[-1], saved[-1])
    for step, loss in losses(saved).items():
        assert loss == pytest.approx(losses(sp)[step], rel=1e-5)


def test_model_factory_args_reach_the_factory():
    """model.factory_args={dim: 16, layers: 3} for tests/data/models/tiny_lm.py (its defaults:
    32 and 2): the exported weights are those of a 3-layer, 16-wide model."""
    factory = ROOT / "tests" / "data" / "models" / "tiny_lm.py"
    out, _ = solo(
        "factory_args",
        f"model.factory={factory}:tiny_lm",
        "model.factory_args={dim: 16, layers: 3}",
        "model.seq_len=64",
    )
    got = shapes(out)
    assert got["embed.weight"] == [256, 16]
    assert {k.split(".")[1] for k in got if k.startswith("layers.")} == {"0", "1", "2"}


def pipe(name: str, *overrides: str):
    """The run folder of a two-stage pipeline run (pipeline_1f1b.yaml, 4 microbatches) whose
    third step is profiled."""
    out, _, _ = run(f"keys2_{name}", 2, "pipeline_1f1b.yaml", *PAIR, *PROFILE, *overrides)
    return out


def ran_actions(out, rank: int) -> list[str]:
    """The compute actions of the profiled step in the order rank ``rank`` ran them."""
    ranges = [e for e in trace(out, rank) if e.get("name", "").startswith("pipeline:")]
    return [e["name"].removeprefix("pipeline:") for e in sorted(ranges, key=lambda e: e["ts"])]


@pytest.mark.parametrize(
    "schedule, virtual_stages",
    [("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2), ("zb_h1", 1)],
)
def test_pipeline_schedule_and_virtual_stages_are_what_runs(schedule, virtual_stages):
    """distributed.pipeline.schedule and virtual_stages: each rank runs exactly the compute
    actions of the schedule they name, in its order (its profiler ranges, one per action,
    against the generated schedule's), so a schedule or stage count left at the default
    (1F1B, one stage a rank) would run another order or other stages."""
    from shardwise import pipeline as pp

    out = pipe(
        f"pp_{schedule}",
        f"distributed.pipeline.schedule={schedule}",
        f"distributed.pipeline.virtual_stages={virtual_stages}",
    )
    planned = pp.make_schedule(schedule, 2, 4, virtual_stages)
    for rank in (0, 1):
        compute = [a for a in planned.actions(rank) if not a.startswith(("SEND", "RECV"))]
        assert ran_actions(out, rank) == compute, (rank, str(planned))


def test_pipeline_parallel_size_cuts_the_model_into_that_many_stages():
    """distributed.pipeline_parallel_size=2 with strategy pipeline on ddp.yaml (no mesh to say
    it): rank 1 runs stage 1 of a two-rank schedule; left at its default (1) both ranks would
    run the whole model as one stage (F0.x on rank 1)."""
    from shardwise import pipeline as pp

    out, _, _ = run(
        "keys2_pp_size",
        2,
        "ddp.yaml",
        *PAIR,
        *PROFILE,
        "training.gradient_accumulation_steps=1",
        "distributed.strategy=pipeline",
        "distributed.pipeline_parallel_size=2",
        "distributed.pipeline.num_microbatches=4",
    )
    planned = pp.make_schedule("1f1b", 2, 4, 1)
    for rank in (0, 1):
        compute = [a for a in planned.actions(rank) if not a.startswith(("SEND", "RECV"))]
        assert ran_actions(out, rank) == compute, rank


def test_training_device_cuda_is_refused_without_a_gpu(tmp_path):
    """training.device=cuda on this machine (no GPU): exit 2 naming the key and the fix before
    any work; left unread, the run would train on the CPU as if asked to."""
    import sys

    import rank_pool
    import torch
    from train_runs import CONFIGS

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: training.device=cuda trains there")
    proc = rank_pool.run(
        [sys.executable, "-m", "shardwise.train", "--config", str(CONFIGS / "ddp.yaml"),
         "training.device=cuda", f"training.checkpoint.dir={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "training.device: cuda" in proc.stderr and "set training.device: cpu" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def test_device_hour_price_prices_the_device_hours():
    """training.device_hour_price=2.5: every record's cost is its device-hours (the run's wall
    time times its one device) at that price, and its tokens per device-hour the tokens trained
    over them; without a price the device-hours are there and the cost is None. Catches the
    price ignored, and figures that do not follow from the measured time."""
    _, recs = solo("price", "training.device_hour_price=2.5")
    per_step = 4 * 64  # micro_batch_size 4 of the tiny GPT's 64 tokens, one rank
    for r in recs:
        assert r["tokens_seen"] == r["step"] * per_step
        assert r["device_hours"] == pytest.approx(r["elapsed_s"] * 1 / 3600, rel=1e-12)
        assert r["cost"] == pytest.approx(r["device_hours"] * 2.5, rel=1e-12)
        assert r["tokens_per_device_hour"] == pytest.approx(r["tokens_seen"] / r["device_hours"])
        assert r["elapsed_s"] >= r["step_s"] > 0
    assert [r["elapsed_s"] for r in recs] == sorted(r["elapsed_s"] for r in recs)
    assert all(r["cost"] is None and r["device_hours"] > 0 for r in base()[1])


def _broken_checkpoint_path(tmp_path, *overrides: str):
    """A run whose checkpoint folder cannot be made (a file holds its name): (exit, records)."""
    from train_runs import launch

    out = tmp_path / "run"
    out.mkdir(parents=True)
    (out / "checkpoints").write_text("not a folder")
    return launch(1, "ddp.yaml", out, *SOLO, "training.max_steps=6", *overrides)


def test_checkpoint_verify_at_start_round_trips_before_step_1(tmp_path):
    """training.checkpoint.verify_at_start=true: before step 1 the state is saved and loaded
    back (the console says so, and the folder it used is gone); with a checkpoint path that
    cannot be written, the run fails before training a step, where without the key it trains
    until its first save (checkpoint.every_steps=5) and fails only then."""
    out, recs = solo("verify", "training.checkpoint.verify_at_start=true")
    assert (
        "checkpoints verified: step 0's state saved and loaded back"
        in (out / "console.log").read_text()
    )
    assert not (out / "checkpoints" / ".verify-at-start").exists()
    assert losses(recs) == losses(base()[1])  # the round trip changes nothing
    code, recs, log = _broken_checkpoint_path(
        tmp_path / "verified", "training.checkpoint.verify_at_start=true"
    )
    assert code != 0 and recs == [], log[-2000:]
    code, recs, log = _broken_checkpoint_path(
        tmp_path / "unverified", "training.checkpoint.every_steps=5"
    )
    assert code != 0 and [r["step"] for r in recs] == [1, 2, 3, 4, 5], log[-2000:]


def _corrupted(tmp_path, name: str, *overrides: str):
    """A two-rank run in which rank 1 corrupts its copy of parameter ``name`` after step 2
    (scripts/corrupt_replica.py): (exit, rank 0's records, console.log, the output)."""
    from train_runs import launch, script

    out = tmp_path / "run"
    code, recs, log = launch(2, "ddp.yaml", out, *PAIR, *overrides,
                             script=script("corrupt_replica.py", 1, 2, name))  # fmt: skip
    console = (out / "console.log").read_text() if (out / "console.log").exists() else ""
    return code, recs, console, log


def test_consistency_every_names_the_corrupted_replica(tmp_path):
    """training.consistency_every=1 under DDP: rank 1's corrupted copy of a weight stops the run
    at step 2, naming the tensor, the rank and the step, with each rank's loss in the records;
    with consistency_every=0 the same corruption trains to the end unseen."""
    code, recs, _, log = _corrupted(tmp_path / "checked", "blocks.0.qkv.weight",
                                    "training.consistency_every=1")  # fmt: skip
    assert code != 0 and [r["step"] for r in recs] == [1, 2], log[-3000:]
    assert "step 2: the copies of blocks.0.qkv.weight[0:" in log
    assert "rank 1 differs from rank 0" in log and "ConsistencyError" in log
    assert all(len(r["loss_by_rank"]) == 2 for r in recs)
    assert recs[0]["loss"] == pytest.approx(sum(recs[0]["loss_by_rank"]) / 2, rel=1e-12)
    code, recs, _, log = _corrupted(tmp_path / "off", "blocks.0.qkv.weight",
                                    "training.consistency_every=0")  # fmt: skip
    assert code == 0 and len(recs) == STEPS, log[-3000:]


def test_consistency_action_warn_names_a_tensor_parallel_replica_and_goes_on(tmp_path):
    """training.consistency_action=warn over a tp mesh: a layer norm's weight, which both tp
    ranks hold whole, corrupted on rank 1 is named in a warning at step 2 and the run goes on
    to the end (stop, the default, would end it there)."""
    code, recs, console, log = _corrupted(
        tmp_path, "blocks.0.norm1.weight", "training.consistency_every=1",
        "training.consistency_action=warn", 'model.mesh_shape=[[1, 2], ["dp", "tp"]]',
    )  # fmt: skip
    assert code == 0 and len(recs) == STEPS, log[-3000:]
    assert "warning: step 2: the copies of blocks.0.norm1.weight[0:" in console, console
    assert "rank 1 differs from rank 0" in console


def _slow_writer(out, seconds: float, *overrides: str):
    """A two-rank run whose checkpoint files each take ``seconds`` longer to write
    (scripts/slow_writer.py): rank 0's records."""
    from train_runs import script, train

    steps = ("training.max_steps=8", "training.checkpoint.every_steps=2")
    recs, _ = train(2, "ddp.yaml", out, *PAIR, *steps, *overrides,
                    script=script("slow_writer.py", seconds))  # fmt: skip
    return recs


def test_checkpoint_async_trains_on_while_a_slow_writer_writes(tmp_path):
    """training.checkpoint.async=true with a writer 1.5 s slower per file: the step after a
    save follows it at once (the save copied the state and returned), where the synchronous
    save holds it for the write; the run's losses are the plain run's, the checkpoints it
    finishes are complete, and a run resumed from step 6's continues with the same losses."""
    from shardwise.train import checkpoint
    from train_runs import copy_until, train

    timed, runs = {}, {}
    for mode in ("true", "false"):
        runs[mode] = _slow_writer(tmp_path / mode, 1.5, f"training.checkpoint.async={mode}")
        at = {r["step"]: r["elapsed_s"] for r in runs[mode]}
        timed[mode] = at[3] - at[2]  # step 3 ran after step 2's save
    assert timed["true"] < 0.75 < 1.5 <= timed["false"], timed
    assert losses(runs["true"]) == losses(runs["false"])
    saved = sorted((tmp_path / "true" / "checkpoints").glob("step-*"))
    assert [d.name for d in saved] == ["step-00000004", "step-00000006", "step-00000008"]
    assert all(checkpoint.verify(d) is None for d in saved)
    copy_until(tmp_path / "true", tmp_path / "resumed", 6)
    steps = (*PAIR, "training.max_steps=8", "training.checkpoint.every_steps=2")
    resumed, log = train(2, "ddp.yaml", tmp_path / "resumed", *steps)
    assert "resumed from" in log and "step-00000006" in log
    assert [r["step"] for r in resumed] == [7, 8]
    assert losses(resumed) == {s: losses(runs["false"])[s] for s in (7, 8)}
