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


def test_tied_copies_start_equal_and_step_with_the_summed_gradient():
    """Catches a tie that is not set up (stage 1's copy keeps its own init) or a gradient that is
    not summed: the tied pair must behave as the one shared weight of the unpipelined model."""
    torch.manual_seed(0)
    shared = nn.Linear(4, 4, bias=False)
    first, last = nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        first.weight.copy_(shared.weight)
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    pipe = pp.Pipeline(
        {0: first, 1: last},
        pp.make_schedule("interleaved_1f1b", 1, 2, 2),
        F.mse_loss,
        tied=[(0, "weight", 1, "weight")],
    )
    torch.testing.assert_close(last.weight, first.weight, rtol=0, atol=0)
    loss = pipe.step(x, y)
    ref = F.mse_loss(shared(shared(x)), y)
    ref.backward()
    assert loss == pytest.approx(ref.item(), rel=1e-6)
    torch.testing.assert_close(first.weight.grad, shared.weight.grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(last.weight.grad, first.weight.grad, rtol=0, atol=0)
    norm = pipe.clip_grad_norm_(1e-3)  # the tied pair counted once, as the shared weight
    ref_norm = torch.nn.utils.clip_grad_norm_(shared.parameters(), 1e-3)
    assert norm == pytest.approx(ref_norm.item(), rel=1e-6)
    torch.testing.assert_close(first.weight.grad, shared.weight.grad, rtol=1e-5, atol=1e-9)


def test_bad_batches_and_ties_are_named_before_any_work():
    blocks = {0: nn.Linear(2, 2)}
    pipe = pp.Pipeline(blocks, pp.make_schedule("1f1b", 1, 4), F.mse_loss)
    with pytest.raises(ValueError, match="inputs: a batch of 3 rows cannot make 4 microbatches"):
        pipe.step(torch.randn(3, 2), torch.randn(3, 2))
    with pytest.raises(ValueError, match="rank of the last stage needs targets"):
        pipe.step(torch.randn(4, 2), None)
    with pytest.raises(ValueError, match="tied parameter nope: stage 0 has no parameter"):
        pp.Pipeline(
            blocks, pp.make_schedule("1f1b", 1, 4), F.mse_loss, tied=[(0, "nope", 0, "bias")]
        )


def test_a_ranks_stages_on_two_devices_are_refused_by_name():
    """The rank's stages' device is where activations are received; stages on two devices have
    no such place, so construction names the parameter and its device."""
    blocks = {0: nn.Linear(2, 2), 1: nn.Linear(2, 2, device="meta")}
    with pytest.raises(ValueError, match=r"stage 1's parameter weight is on meta but .* cpu"):
        pp.Pipeline(blocks, pp.make_schedule("interleaved_1f1b", 1, 4, 2), F.mse_loss)


def test_group_times_time_each_stage_and_clear_the_gradients():
    blocks = [nn.Linear(16, 16) for _ in range(3)]
    times = pp.group_times(blocks, [[0, 1], [2]], torch.randn(8, 16), repeats=2)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert all(p.grad is None for b in blocks for p in b.parameters())
    with pytest.raises(ValueError, match="repeats 0 must be at least 1"):
        pp.block_times(blocks, torch.randn(8, 16), repeats=0)


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
    """The slow block gets a stage of its own. Each fast block is 1/12 of the slow one, so
    moving one across a boundary changes a stage's time by >= 8%, far above the timing noise
    of a loaded machine (with fast blocks of 1/30, a 3% change, a busy CI host once let the
    refinement move one)."""
    torch.manual_seed(0)
    fast = [nn.Sequential(*(nn.Linear(64, 64) for _ in range(5))) for _ in range(3)]
    slow = nn.Sequential(*(nn.Linear(64, 64) for _ in range(60)))
    blocks = [*fast, slow]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: no waiting on a preempted sibling thread
    try:
        groups = pp.split_by_time(blocks, 2, torch.randn(2048, 64), repeats=5)
    finally:
        torch.set_num_threads(threads)
    assert groups == [[0, 1, 2], [3]], groups
    assert all(p.grad is None for b in blocks for p in b.parameters())


def _rel64(ours, ref):
    return ((ours.double() - ref).norm() / ref.norm()).item()


def test_deferred_linear_computes_what_linear_computes():
    """Forward bit-exact with F.linear (fp32 and under bf16 autocast); gradients outside a
    pipeline within 2x F.linear's own error against a float64 reference."""
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    torch.testing.assert_close(pp._C.deferred_linear(x, w, b), F.linear(x, w, b), rtol=0, atol=0)
    torch.testing.assert_close(pp._C.deferred_linear(x, w), F.linear(x, w), rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, ref = pp._C.deferred_linear(x, w, b), F.linear(x, w, b)
    assert ours.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    g = torch.randn(3, 5, 8)
    grads = {}
    for name, fn in (("ours", pp._C.deferred_linear), ("torch", F.linear)):
        grads[name] = torch.autograd.grad(fn(x, w, b), (x, w, b), g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    exact = torch.autograd.grad(F.linear(x64, w64, b64), (x64, w64, b64), g.double())
    for ours, ref, e in zip(grads["ours"], grads["torch"], exact, strict=True):
        assert _rel64(ours, e) <= 2 * _rel64(ref, e) + 1e-12


def test_deferred_linear_rejects_a_mismatched_weight():
    with pytest.raises(ValueError, match="last dimension of input must be in_features"):
        pp._C.deferred_linear(torch.randn(2, 4), torch.randn(3, 5))


@pytest.mark.parametrize("autocast", [False, True])
def test_zero_bubble_on_one_rank_changes_no_bits(autocast):
    """The same deferred layers under 1F1B (weight gradients inside B) and ZB-H1 (queued in I,
    run in W): identical gradients, so deferral moves work without changing a bit; and both
    within fp32 tolerance of the plain model."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randn(8, 16)

    def blocks():
        torch.manual_seed(1)
        return [nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Tanh()) for _ in range(3)]

    def loss_fn(out, target):
        return F.mse_loss(out.float(), target)

    results = {}
    for kind in ("1f1b", "zb_h1", "plain"):
        stages = blocks()
        if kind == "plain":
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = nn.Sequential(*stages)(x)
            loss_fn(out, y).backward()
        else:
            stage = pp.defer_weight_gradients(nn.Sequential(*stages))

            def run(inp, stage=stage):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    return stage(inp)

            pipe = pp.Pipeline({0: run}, pp.make_schedule(kind, 1, 4), loss_fn)
            pipe.step(x, y)
            if kind == "zb_h1":
                assert pipe.last["peak_stashed"] == 1
        results[kind] = [p.grad for s in stages for p in s.parameters()]
    for a, b in zip(results["1f1b"], results["zb_h1"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if not autocast:
        for a, b in zip(results["zb_h1"], results["plain"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_zero_bubble_schedule_has_a_third_of_the_1f1b_bubble():
    for p, m in ((2, 8), (4, 8), (4, 12)):
        zb = pp.validate(pp.make_schedule("zb_h1", p, m))
        one = pp.validate(pp.make_schedule("1f1b", p, m))
        assert zb["ok"], zb["error"]
        assert zb["makespan"] == pytest.approx(3 * m + p - 1)
        assert one["makespan"] == pytest.approx(3 * (m + p - 1))
