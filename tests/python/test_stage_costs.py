"""A pipeline's stages priced one by one (``train/stage_costs.py``): the stages the engine cuts,
traced on fake tensors, and the schedule's makespan over their costs."""

from dataclasses import replace
from pathlib import Path

import pytest
from shardwise.models.gpt import GPT, PRESETS
from shardwise.train import calibration, op_trace, prediction, stage_costs, step_time
from shardwise.train.config import load_config
from shardwise.train.config_plan import plan_for_config
from shardwise.train.gpt_costs import gpt_traces

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
FLAT = {4: {64: 1e12}, 2: {64: 2e12}}
RATES = calibration.DeviceRates("test", FLAT, FLAT, FLAT, 1e11, 1e-5, False, "given")


@pytest.mark.parametrize("stages", [2, 3])
def test_the_stages_together_run_the_whole_model_s_flops(stages):
    """The stages' forward and backward FLOPs add up to the whole model's trace; with
    checkpointing, each stage's backward runs its blocks' forward again (torch stops the
    recomputation after the last tensor backward needs, so a block's output projection is not
    rerun): one more attention forward per block, at most one more forward of the blocks.
    Catches a cut that drops or repeats a block, a backward traced without its stage's input
    gradient, or a checkpointed stage whose recomputation is left out."""
    cfg = PRESETS["tiny"]
    whole = op_trace.trace_training_step(lambda: GPT(cfg), (2, cfg.seq_len), bf16=False)
    forward = op_trace.trace_training_step(
        lambda: GPT(cfg), (2, cfg.seq_len), bf16=False, backward=False
    )
    plain = stage_costs.stage_traces(cfg, stages, 2, False)
    assert len(plain) == stages
    assert sum(f.flops + b.flops for f, b in plain) == whole.flops
    assert plain[-1][0].flops > plain[0][0].flops  # the head and loss sit on the last stage
    again = stage_costs.stage_traces(cfg, stages, 2, False, checkpointing=True)
    assert [f.flops for f, _ in again] == [f.flops for f, _ in plain]
    extra = sum(b.flops for _, b in again) - sum(b.flops for _, b in plain)
    head = 2 * 2 * cfg.seq_len * cfg.dim * cfg.vocab_size  # the logits' forward matmul
    assert 0 < extra <= forward.flops - head
    rerun = [
        op for _, b in again for op in b.ops if op.kind == "attention" and "backward" not in op.name
    ]
    assert len(rerun) == cfg.layers


def test_the_slowest_stage_sets_the_pace_and_equal_stages_give_the_formula():
    """Equal stages of 1/p of the micro-batch give 1F1B's (m + p - 1) slots; a last stage twice
    as slow gives the fill and drain plus (m - 1) of its own cost, and a pipeline row's compute
    is that makespan. Catches per-stage costs dropped on the way to the simulator or to the
    row."""
    equal = ((0.25, 0.5),) * 2
    assert stage_costs.pipeline_makespan(equal, 2, 4) == pytest.approx((4 + 1) * 0.75)
    slow_last = ((0.25, 0.5), (0.5, 1.0))
    assert stage_costs.pipeline_makespan(slow_last, 2, 4) == pytest.approx(0.75 + 1.5 + 3 * 1.5)
    makespan = stage_costs.pipeline_makespan(slow_last, 2, 4)
    work = replace(step_time.Work(1.5, 4, 1000, 28), pipeline_s=makespan)
    row = step_time.predict_row(
        _pipeline_row(), work, RATES, step_time.Links(1e30), optimizer_bytes_per_param=12,
        ranks=2, stages=2,
    )  # fmt: skip
    assert row.compute_s == pytest.approx(0.75 + 1.5 + 3 * 1.5)


def _pipeline_row():
    from shardwise.train import planner

    return planner.Row("pipeline", "pipeline", 0, 0, 0, 0, 0, 0, 0, True, 0, 0, None)


def test_a_pipeline_config_is_predicted_over_its_own_stages(monkeypatch):
    """``pipeline_1f1b.yaml`` (2 stages of the tiny GPT, 4 micro-batches): its predicted compute
    is the simulator's makespan over the stages traced one by one, longer than the uniform
    formula because the last stage holds the head and the loss; a cut by measured time keeps
    the formula, (m + p - 1) slots of half the traced micro-batch (the cut balances the
    stages). Catches the config's pipeline section not reaching the prediction."""
    monkeypatch.setattr(prediction, "rates_for", lambda device, threads: RATES)
    cfg = load_config(CONFIGS / "pipeline_1f1b.yaml", [])
    result = plan_for_config(cfg, 2**40)
    staged = prediction.for_config(cfg, result, device="cpu").predicted["compute_s"]
    timed = load_config(CONFIGS / "pipeline_1f1b.yaml", ["distributed.pipeline.split=time"])
    uniform = prediction.for_config(timed, result, device="cpu").predicted["compute_s"]
    traces = stage_costs.stage_traces(cfg.gpt_config(), 2, cfg.training.micro_batch_size, False)
    seconds = stage_costs.stage_seconds(traces, RATES)
    assert staged == pytest.approx(stage_costs.pipeline_makespan(seconds, 2, 4))
    whole = gpt_traces(cfg.gpt_config(), cfg.training.micro_batch_size, False)[0]
    assert uniform == pytest.approx((4 + 2 - 1) * step_time.trace_seconds(whole, RATES) / 2)
    assert staged > uniform
