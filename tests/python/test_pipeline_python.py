"""The pipeline's Python face, one process: schedules from C++ with their validation report,
splitting blocks into balanced stages, a single-rank pipeline against the plain model, and the
timeline renderers."""

import pytest
import shardwise.pipeline as pp
import torch
import torch.nn.functional as F
from shardwise.pipeline import timeline
from torch import nn


def test_schedules_come_validated_with_their_bubble():
    for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
        s = pp.make_schedule(kind, 4, 8, v)
        report = pp.validate(s)
        assert report["ok"], report["error"]
        if kind != "interleaved_1f1b":
            assert report["bubble_fraction"] == pytest.approx(3 / 11)
    assert pp.make_schedule("1f1b", 2, 1).actions(1) == ["RECV_F1.0", "F1.0", "B1.0", "SEND_B1.0"]
    with pytest.raises(ValueError, match="virtual_stages > 1 needs the interleaved_1f1b"):
        pp.make_schedule("1f1b", 2, 4, 2)


def test_split_by_parameters_balances_and_keeps_order():
    blocks = [nn.Linear(10, 10) for _ in range(3)] + [nn.Linear(10, 60)] + [nn.Linear(10, 10)]
    groups = pp.split_by_parameters(blocks, 3)
    assert [i for g in groups for i in g] == list(range(5))
    assert all(groups)
    sizes = [sum(sum(p.numel() for p in blocks[i].parameters()) for i in g) for g in groups]
    assert max(sizes) <= 660 + 110, sizes  # the big block alone bounds the best split
    with pytest.raises(ValueError, match="num_stages 6"):
        pp.split_by_parameters(blocks, 6)


def test_single_rank_interleaved_pipeline_matches_the_model():
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4))
    x, y = torch.randn(6, 8), torch.randn(6, 8)
    pipe = pp.Pipeline(
        {i: blocks[i] for i in range(4)}, pp.make_schedule("interleaved_1f1b", 1, 3, 4), F.mse_loss
    )
    loss = pipe.step(x, y)
    grads = [p.grad.clone() for p in blocks.parameters()]
    blocks.zero_grad()
    ref = F.mse_loss(nn.Sequential(*blocks)(x), y)
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-6)
    for g, p in zip(grads, blocks.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=1e-6, atol=1e-7)
    actions, times = pipe.gather_times()
    text = timeline.render_text(actions, times, width=40)
    assert text.startswith("rank 0 |") and "bubble" in text


def test_timeline_png(tmp_path):
    pytest.importorskip("matplotlib")
    s = pp.make_schedule("1f1b", 2, 3)
    report = pp.validate(s)
    actions = [s.actions(r) for r in range(2)]
    path = timeline.plot(actions, report["times"], tmp_path / "t.png", "simulated")
    assert path.stat().st_size > 1000
    assert timeline.bubble_fraction(actions, report["times"]) == pytest.approx(
        report["bubble_fraction"]
    )


def test_split_by_time_isolates_a_slow_block():
    torch.manual_seed(0)
    fast = [nn.Linear(64, 64) for _ in range(3)]
    slow = nn.Sequential(*(nn.Linear(64, 64) for _ in range(30)))
    blocks = [*fast, slow]  # by parameters the same imbalance; by time ~10x
    groups = pp.split_by_time(blocks, 2, torch.randn(256, 64))
    assert groups == [[0, 1, 2], [3]], groups
    assert all(p.grad is None for b in blocks for p in b.parameters())
