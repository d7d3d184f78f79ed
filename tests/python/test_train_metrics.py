"""The training metrics' pieces, one process: the straggler rule, model FLOPs per token, the
measured peak, and the JSONL sink."""

import json

import pytest
from shardwise import pieces
from shardwise.models import PRESETS
from shardwise.train import metrics


def test_straggler_is_the_rank_far_above_the_median():
    assert metrics.straggler([1.0, 1.02, 0.98, 1.6]) == 3
    assert metrics.straggler([1.0, 1.1, 1.2, 1.05]) is None  # within 1.25x of the median
    assert metrics.straggler([3.0]) is None


def test_flops_per_token_counts_weights_and_attention():
    cfg = PRESETS["small"]
    expected = 6 * cfg.num_parameters() + 12 * cfg.layers * cfg.seq_len * cfg.dim
    assert metrics.flops_per_token(cfg.num_parameters(), cfg.layers, cfg.seq_len, cfg.dim) == (
        expected
    )


def test_measured_peak_is_a_plausible_flop_rate():
    peak = metrics.measured_peak_flops(size=256)
    assert 1e8 < peak < 1e14


def test_jsonl_sink_writes_every_record(tmp_path):
    sink = metrics.Sinks(tmp_path, total_steps=2, start_step=0, enabled=True)
    for step in (1, 2):
        sink.write({"step": step, "loss": 1.0 / step, "tokens_per_s": 10.0})
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert (tmp_path / "tensorboard").is_dir()


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    """The trainer's schedule (the C++ rule train_gpt shares), from Python."""
    from shardwise import _C

    assert _C.warmup_cosine_lr(5, 1.0, 10, 110) == pytest.approx(0.5)
    assert _C.warmup_cosine_lr(10, 1.0, 10, 110) == pytest.approx(1.0)
    assert _C.warmup_cosine_lr(60, 1.0, 10, 110) == pytest.approx(0.55)
    assert _C.warmup_cosine_lr(110, 1.0, 10, 110) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="warmup_steps 20"):
        _C.warmup_cosine_lr(1, 1.0, 20, 10)


def test_pieces_fill_copies_overlaps_and_reports_gaps():
    import torch

    full = torch.arange(10.0)
    saved = [
        {"name": "w", "start": 0, "values": full[:6]},
        {"name": "w", "start": 6, "values": full[6:]},
    ]
    mine = torch.zeros(4)
    pieces.fill([pieces.Slot("w", 4, mine)], saved)
    assert mine.tolist() == [4.0, 5.0, 6.0, 7.0]
    with pytest.raises(ValueError, match="cover only 2 of the 4 elements"):
        pieces.fill([pieces.Slot("w", 4, torch.zeros(4))], saved[:1])
