"""The step-time model (``train/step_time.py``) and what it rests on: the operator trace on fake
tensors (``op_trace.py``), the device rates and their cache (``calibration.py``), the cluster
file (``cluster.py``), and ``shardwise-plan``'s prediction (``prediction.py``)."""

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from shardwise.models.gpt import GPT, PRESETS
from shardwise.train import calibration, metrics, op_trace, planner, prediction, step_time
from shardwise.train.cluster import load_cluster
from shardwise.train.plan_cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
ATTENTION = {4: {64: 5e11}, 2: {64: 1e12}}
RATES = calibration.DeviceRates(
    "test", {4: {64: 1e12}, 2: {64: 2e12}}, ATTENTION, ATTENTION, 1e11, 1e-5, False, "given"
)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_traced_flops_are_the_training_flops_per_token(preset):
    """The trace counts torch's FLOP formulas over every matmul and attention of a forward and
    backward; the MFU's 6N + 12·L·d·s per token must agree within 4% (it ignores the embedding's
    lookup and counts the tied head once). Catches attention left uncounted: torch has no formula
    for the CPU flash kernel, which once dropped 6% of GPT small's FLOPs."""
    cfg = PRESETS[preset]
    traced = op_trace.trace_training_step(lambda: GPT(cfg), (2, cfg.seq_len), bf16=True)
    formula = metrics.flops_per_token(cfg.num_parameters(), cfg.layers, cfg.seq_len, cfg.dim)
    assert abs(traced.flops - formula * 2 * cfg.seq_len) <= 0.04 * traced.flops
    assert any(op.kind == "attention" and op.flops > 0 for op in traced.ops)


def test_views_move_nothing_and_in_place_writes_count():
    """A view aliases its input (no bytes); an in-place add writes its input (counted); a matmul
    gets torch's 2·m·k·n. Catches views priced as copies, or in-place ops dropped as views."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.ones(8, 4), torch.ones(4, 2)

        def run():
            a.view(4, 8).t()
            a.add_(1.0)
            torch.mm(a, b)

        ops = op_trace.trace(run).ops
    assert [op.name for op in ops] == ["aten.add_", "aten.mm"]
    assert ops[0].bytes == 2 * 8 * 4 * 4 and ops[0].flops == 0
    assert ops[1].flops == 2 * 8 * 4 * 2 and ops[1].kind == "matmul" and ops[1].size == 2


def _row(name, comm=2e9, inter=None, optimizer_state=12e9):
    comm = None if comm is None else int(comm)
    return planner.Row(name, name, 0, 0, int(optimizer_state), 0, 0, 0, 0, True, 0, comm,
                       inter)  # fmt: skip


def _work():
    return step_time.Work(1.0, 4, 1000, 28)  # 1 s per micro-batch, 4 of them


def test_step_time_adds_compute_optimizer_and_communication_on_the_cpu():
    """The CPU's collectives use the computing cores: nothing overlaps. 4 micro-batches of 1 s,
    1e9 parameters updated (12 GB of optimizer state at 12 bytes each) x 28 bytes at 1e11 B/s,
    2 GB over 1e10 B/s within the host and 1 GB over 1e9 B/s across hosts."""
    links = step_time.Links(1e10, 1e9)
    t = step_time.predict_row(
        _row("zero3", inter=1e9), _work(), RATES, links, optimizer_bytes_per_param=12, ranks=2
    )
    assert t.compute_s == pytest.approx(4.0) and t.optimizer_s == pytest.approx(0.28)
    assert t.comm_s == pytest.approx(0.2 + 1.0) and t.exposed_comm_s == t.comm_s
    assert t.step_s == pytest.approx(4.0 + 0.28 + 1.2)
    assert t.tokens_per_s == pytest.approx(2 * 1000 / t.step_s)  # two replicas


def test_on_a_gpu_communication_hides_behind_what_each_engine_overlaps():
    """DDP hides its all-reduce behind the backward (2/3 of the compute), ZeRO-3 behind forward
    and backward (prefetch); the rest is exposed. Catches a model that overlaps everything."""
    flat = {4: {64: 1e12}, 2: {64: 1e12}}
    gpu = calibration.DeviceRates("gpu", flat, flat, flat, 1e11, 0, True, "")
    links = step_time.Links(1e9)  # 10 s of communication against 4 s of compute
    args = dict(optimizer_bytes_per_param=12, ranks=2)
    ddp = step_time.predict_row(_row("ddp", comm=1e10), _work(), gpu, links, **args)
    zero3 = step_time.predict_row(_row("zero3", comm=1e10), _work(), gpu, links, **args)
    assert ddp.exposed_comm_s == pytest.approx(10 - 4 * 2 / 3)
    assert zero3.exposed_comm_s == pytest.approx(10 - 4)


def test_the_cpu_update_is_priced_at_its_measured_rate_and_per_tensor():
    """Where the update's rate is measured (the CPU), 1e9 parameters at 1e8 per second take 10 s
    in AdamW's 28 bytes (SGD's 20: 20/28 of it), plus 1e-3 s per tensor: all 100 of DDP's, a
    quarter of them on one of 4 pipeline stages, one flat partition under the ZeRO engine. A
    GPU's stays the bandwidth's. Catches the update priced by the bandwidth on a CPU, where
    the fused kernel runs about 3x slower than that, or its tensors left uncounted (28 small
    tensors cost the tiny GPT's step about 0.5 ms)."""
    cpu = replace(RATES, update_params_per_s=1e8, update_tensor_seconds=1e-3)
    assert cpu.update_seconds(1e9, 100, 28) == pytest.approx(10 + 0.1)
    assert cpu.update_seconds(1e9, 0, 20) == pytest.approx(10 * 20 / 28)
    assert RATES.update_seconds(1e9, 100, 28) == pytest.approx(1e9 * 28 / 1e11)
    links, args = step_time.Links(1e30), dict(optimizer_bytes_per_param=12, ranks=4)
    work = replace(_work(), parameter_tensors=100)
    ddp = step_time.predict_row(_row("ddp", 0), work, cpu, links, **args)
    assert ddp.optimizer_s == pytest.approx(10 + 0.1)
    pipe = step_time.predict_row(_row("pipeline", 0), work, cpu, links, stages=4, **args)
    assert pipe.optimizer_s == pytest.approx(10 + 0.025)
    flat = replace(work, flat_update=True)
    zero = step_time.predict_row(_row("zero2", 0), flat, cpu, links, **args)
    assert zero.optimizer_s == pytest.approx(10 + 0.001)


def test_the_traced_model_s_parameter_tensors_reach_the_prediction():
    """The tiny GPT's tensors, counted on a meta-device model (its tied head once), are what
    the prediction's optimizer pays for, and a ZeRO config's engine steps one flat partition.
    Catches a count from another model, or ZeRO charged per module tensor."""
    from shardwise.train import gpt_costs, prediction
    from shardwise.train.config import load_config
    from shardwise.train.config_plan import plan_for_config

    count = sum(1 for _ in GPT(PRESETS["tiny"]).parameters())
    assert gpt_costs.parameter_tensors(PRESETS["tiny"]) == count
    seen = []
    real = step_time.predict_plan
    for name, flat in (("ddp.yaml", False), ("zero2.yaml", True)):
        cfg = load_config(str(CONFIGS / name), ["training.device=cpu"])

        def spy(plan, work, *a, **k):
            seen.append((work.parameter_tensors, work.flat_update))
            return real(plan, work, *a, **k)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(step_time, "predict_plan", spy)
            m.setattr(prediction, "rates_for", lambda device, threads=1: RATES)
            prediction.for_config(cfg, plan_for_config(cfg, 2**34))
        assert seen[-1] == (count, flat)


def test_a_pipeline_pays_its_bubble_and_a_tp_row_trains_fewer_tokens():
    """1F1B over p stages runs (m + p - 1) slots of 1/p of the micro-batch; its p ranks hold one
    replica, so it trains 1/p of the tokens per step, as a tp row of degree t trains 1/t."""
    args = dict(optimizer_bytes_per_param=12, ranks=4)
    links = step_time.Links(1e30)
    pipe = step_time.predict_row(_row("pipeline", 0, None, 0), _work(), RATES, links, stages=4,
                                 **args)  # fmt: skip
    assert pipe.compute_s == pytest.approx((4 + 4 - 1) / 4)
    assert pipe.tokens_per_s == pytest.approx(1000 / pipe.step_s)
    tp = step_time.predict_row(_row("tp_zero3", 0, None, 0), _work(), RATES, links, tp=2, **args)
    assert tp.compute_s == pytest.approx(2.0) and tp.tokens_per_s == pytest.approx(2 * 1000 / 2.0)
    assert step_time.predict_row(_row("ddp", comm=None), _work(), RATES, links, **args) is None


def test_the_cpu_calibration_is_cached_and_a_bad_cache_is_measured_again(tmp_path, monkeypatch):
    """The first plan measures and writes the cache; the next reads it; an entry with a field
    missing or out of range (a file edited, or from another version) is not trusted."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []

    cpu = replace(
        RATES, name="cpu", resident_base_bytes=2**29, resident_warmup_bytes=2**27,
        allocator_retention=1.2, update_params_per_s=1e8, update_tensor_seconds=1e-5,
        collective_step_seconds=5e-6, message_seconds=8e-5,
    )  # fmt: skip

    def measure(threads):
        measured.append(threads)
        return cpu

    monkeypatch.setattr(calibration, "_measure_fresh", measure)
    assert calibration.cpu_rates(3) == cpu and measured == [3]
    assert calibration.cpu_rates(3) == cpu and measured == [3]  # from the file
    path = tmp_path / "shardwise" / "calibration.json"
    cached = json.loads(path.read_text())
    (key,) = cached
    cached[key]["memory_bytes_per_s"] = -1
    path.write_text(json.dumps(cached))
    calibration.cpu_rates(3)
    assert measured == [3, 3]
    path.write_text("not json")
    calibration.cpu_rates(3)
    assert measured == [3, 3, 3]
    cached = json.loads(path.read_text())
    cached[key]["allocator_retention"] = 0.5  # below 1: retains less than is live
    path.write_text(json.dumps(cached))
    calibration.cpu_rates(3)
    assert measured == [3, 3, 3, 3]
    cached = json.loads(path.read_text())
    del cached[key]["update_params_per_s"]  # an entry from before the update was measured
    path.write_text(json.dumps(cached))
    calibration.cpu_rates(3)
    assert measured == [3, 3, 3, 3, 3]
    cached = json.loads(path.read_text())
    cached[key]["message_seconds"] = 0.0  # a latency not measured
    path.write_text(json.dumps(cached))
    calibration.cpu_rates(3)
    assert measured == [3, 3, 3, 3, 3, 3]


def test_a_calibration_of_another_version_is_measured_again(tmp_path, monkeypatch):
    """The cache key names the calibration's version: an entry measured with other sizes (the
    attention curve was once keyed by head size alone) is never read as this version's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = calibration._cpu_key(2)
    assert key.endswith(f"v{calibration.CALIBRATION_VERSION}")
    old = key.rsplit("|", 1)[0] + f"| v{calibration.CALIBRATION_VERSION - 1}"
    path = tmp_path / "shardwise" / "calibration.json"
    path.parent.mkdir(parents=True)
    cpu = replace(RATES, name="cpu", resident_base_bytes=2**29)
    path.write_text(json.dumps({old: asdict(cpu)}))
    measured = []
    monkeypatch.setattr(calibration, "_measure_fresh", lambda t: measured.append(t) or cpu)
    calibration.cpu_rates(2)
    assert measured == [2]


def test_a_flop_operator_is_priced_in_its_inputs_dtype_at_its_shape():
    """Under bf16 autocast the attention runs in bf16, though CPU flash attention also returns
    (and its backward takes) an fp32 logsumexp: pricing it by its widest tensor put bf16
    attention at the fp32 rate, 4x too fast for a short sequence's backward. Its size is the
    query's positions x head size (the CPU kernel's rate follows that product)."""
    cfg = PRESETS["tiny"]
    trace = op_trace.trace_training_step(lambda: GPT(cfg), (2, cfg.seq_len), bf16=True)
    attention = [op for op in trace.ops if "attention" in op.name]
    assert {op.kind for op in attention} == {"attention", "attention_backward"}
    assert {op.itemsize for op in attention} == {2}
    assert {op.size for op in attention} == {cfg.seq_len * cfg.dim // cfg.heads}
    fp32 = op_trace.trace_training_step(lambda: GPT(cfg), (2, cfg.seq_len), bf16=False)
    assert {op.itemsize for op in fp32.ops if op.flops} == {4}


def test_bf16_parameters_trace_every_matmul_in_bf16_without_autocast_casts():
    """ZeRO and FSDP's mixed precision hold bf16 parameters and run no autocast: the trace must
    hold no cast of a weight (autocast's per-forward copies) and every matmul in bf16."""
    cfg = PRESETS["tiny"]
    shape = (2, cfg.seq_len)
    autocast = op_trace.trace_training_step(lambda: GPT(cfg), shape, bf16=True)
    low = op_trace.trace_training_step(lambda: GPT(cfg), shape, bf16=True, low_params=True)
    assert {op.itemsize for op in low.ops if op.flops} == {2}
    casts = [op for op in autocast.ops if op.name == "aten._to_copy"]
    low_casts = [op for op in low.ops if op.name == "aten._to_copy"]
    assert len(low_casts) < len(casts) // 2, (len(low_casts), len(casts))


def test_small_matmuls_run_at_the_measured_curve_s_rate():
    """A matmul's rate follows its smallest dimension: the measured points, log2-interpolated
    between them, the ends held beyond. Catches a width-64 model priced at a 1024-wide matmul's
    rate (the tiny preset ran 2-3x its prediction)."""
    curve = {4: {64: 1e10, 256: 3e10, 1024: 5e10}}
    rates = calibration.DeviceRates("cpu", curve, curve, curve, 1e10, 1e-6, False, "")
    assert rates.flop_rate("matmul", 4, 64) == 1e10 and rates.flop_rate("matmul", 4, 16) == 1e10
    assert rates.flop_rate("matmul", 4, 128) == pytest.approx(2e10)
    assert rates.flop_rate("matmul", 4, 4096) == 5e10 == rates.flop_rate("matmul", 4)
    assert rates.flop_rate("attention", 2, 256) == 3e10  # bf16 unmeasured: the fp32 curve


def test_gpu_rates_by_key_or_cuda_name_and_unknown_devices_refused():
    assert calibration.device_key("NVIDIA H200") == "h200"
    assert calibration.device_key("NVIDIA H100 80GB HBM3") == "h100"
    h200 = calibration.gpu_rates("h200")
    assert h200.flop_rate("matmul", 2) == pytest.approx(805e12, rel=1e-3)
    assert h200.overlaps_communication and "measured" in h200.source
    with pytest.raises(ValueError, match="no published rates.*'cpu'"):
        calibration.device_key("Radeon 7")


def _write(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text,names",
    [
        ("device: h100\nhosts: 2\ngpus_per_host: 8\n", "gpu_mem_gib"),
        ("device: tpu\nhosts: 2\ngpus_per_host: 8\ngpu_mem_gib: 80\n", "device 'tpu'"),
        ("device: h100\nhosts: 0\ngpus_per_host: 8\ngpu_mem_gib: 80\n", "hosts must be"),
        ("device: h100\nhosts: 2\ngpus_per_host: 8\ngpu_mem_gib: 80\nnics: 8\n", "nics"),
        ("- a\n", "mapping"),
        (
            "device: h100\nhosts: 2\ngpus_per_host: 8\ngpu_mem_gib: 80\ncores_per_host: 64\n",
            "cores_per_host sizes a CPU host",
        ),
        (
            "device: cpu\nhosts: 2\ngpus_per_host: 1\ngpu_mem_gib: 8\ncores_per_host: 1.5\n",
            "cores_per_host must be a whole number",
        ),
    ],
)
def test_a_bad_cluster_file_is_refused_naming_the_key(tmp_path, text, names):
    with pytest.raises(ValueError, match=names):
        load_cluster(_write(tmp_path, text))


def test_plan_with_a_cluster_file_predicts_the_config_s_step(tmp_path, capsys):
    """--cluster stands for the machine: 4 hosts x 8 H100s, the config's model and strategy;
    --json gives the run's row under the records' names, every row a step time, and the rows
    that fit ranked by predicted tokens/s."""
    cluster = _write(tmp_path, "device: h100\nhosts: 4\ngpus_per_host: 8\ngpu_mem_gib: 80\n")
    argv = ["--config", str(CONFIGS / "fsdp.yaml"), "--cluster", cluster, "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 32 and out["ranks_per_host"] == 8
    assert out["device"] == "h100" and out["strategy"] == "zero3"
    keys = {"step_s", "tokens_per_s", "compute_s", "comm_s", "peak_device_mb_per_rank"}
    assert set(out["predicted"]) == keys
    times = out["step_times"]
    assert times["zero3"]["step_s"] == out["predicted"]["step_s"] > 0
    ranked = [times[name]["tokens_per_s"] for name in out["ranking"]]
    assert ranked == sorted(ranked, reverse=True) and len(ranked) >= 3
    assert main(["--config", str(CONFIGS / "fsdp.yaml"), "--cluster", cluster, "--gpus", "8"]) == 2
    assert "drop --gpus" in capsys.readouterr().err


def test_a_cpu_cluster_s_cores_per_host_set_its_ranks_threads_and_turns(
    tmp_path, monkeypatch, capsys
):
    """Catches a CPU cluster planned on this machine's cores instead of its own: hosts of one
    core give each rank one thread (the rates asked at 1 thread), and two ranks on a host of
    one core take turns, their step priced at the measured penalty of taking them."""
    asked = []
    real = prediction.rates_for
    monkeypatch.setattr(prediction, "rates_for", lambda d, t: asked.append(t) or real(d, t))
    monkeypatch.setattr(prediction, "oversubscription_penalty", lambda: 1.25)
    argv = ["--config", str(CONFIGS / "ddp.yaml"), "--json"]
    one = "device: cpu\nhosts: 2\ngpus_per_host: 1\ngpu_mem_gib: 8\ncores_per_host: 1\n"
    assert main([*argv, "--cluster", _write(tmp_path, one)]) == 0
    alone = json.loads(capsys.readouterr().out)["predicted"]
    two = one.replace("gpus_per_host: 1", "gpus_per_host: 2")
    assert main([*argv, "--cluster", _write(tmp_path, two)]) == 0
    shared = json.loads(capsys.readouterr().out)["predicted"]
    assert asked == [1, 1]
    assert shared["compute_s"] == pytest.approx(alone["compute_s"] * 2 * 1.25, rel=1e-6)


def test_plan_table_on_the_cpu_shows_each_row_s_step(capsys):
    """A CPU config's plan prices its rows with this CPU's measured rates (cached after the
    first plan) and names what they rest on."""
    argv = ["--config", str(CONFIGS / "ddp.yaml"), "--gpus", "2", "--gpu-mem", "8"]
    argv += ["--device", "cpu"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "step s" in out and "tokens/s" in out
    assert "step times on cpu: measured on this CPU" in out
    assert "predicted (ddp): step_s" in out
