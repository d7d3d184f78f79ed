"""The per-rank memory planner: ZeRO formulas against hand-computed bytes, the recommendation
order of the practice notes, the CLI, and the DDP-style model state against a measured AdamW step
on the bundled GPT."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from shardwise.models.gpt import GPT, PRESETS
from shardwise.train import config_plan, gpt_costs, planner
from shardwise.train.plan_cli import main
from shardwise.train.planner import activation_bytes, gpt_gather_bytes, plan

GB = 10**9
PHI = 7 * GB  # 7e9 parameters
N = 8


def test_bf16_adam_rows_match_the_zero_formulas_for_7b_on_8():
    result = plan(PHI, N, 80 * GB)
    expected = {  # (parameters, gradients, optimizer state) in bytes, by hand
        "ddp": (14e9, 14e9, 84e9),  # 2Φ + 2Φ + 12Φ = 112 GB
        "zero1": (14e9, 14e9, 10.5e9),  # 2Φ + 2Φ + 12Φ/8 = 38.5 GB
        "zero2": (14e9, 1.75e9, 10.5e9),  # 2Φ + 14Φ/8 = 26.25 GB
        "fsdp_shard_grad_op": (14e9, 1.75e9, 10.5e9),
        "zero3": (1.75e9, 1.75e9, 10.5e9),  # 16Φ/8 = 14 GB
        "zero3_offload": (1.75e9, 1.75e9, 0),
    }
    for name, (p, g, o) in expected.items():
        row = result.row(name)
        assert (row.parameters, row.gradients, row.optimizer_state) == (p, g, o), name
        # torch DDP's buckets hold one more copy of the gradients (gradient_as_bucket_view off)
        buckets = g if name == "ddp" else 0
        assert row.total == p + g + o + (buckets or row.gathered), name
    assert result.row("ddp").gathered == 14e9
    assert result.row("ddp").total == 126 * GB  # the paper's 112 GB + 14 GB of buckets
    assert not result.row("ddp").fits  # 126 GB × 1.1 > 80 GB
    assert result.row("zero2").total == 26.25e9 and result.row("zero2").fits
    assert result.row("zero3_offload").host == 10.5e9
    assert result.row("zero1").required == 42.35e9  # × 1.1


def test_fp32_and_sgd_bytes_per_parameter():
    fp32 = plan(PHI, N, 80 * GB, mixed_precision="fp32")
    ddp = fp32.row("ddp")
    assert (ddp.parameters, ddp.gradients, ddp.optimizer_state) == (28e9, 28e9, 56e9)  # 4+4+8
    assert fp32.row("zero3").total == 112 * GB / N
    sgd = plan(PHI, N, 80 * GB, optimizer="sgd").row("ddp")
    assert sgd.optimizer_state == 8 * PHI  # fp32 master + momentum
    with pytest.raises(ValueError, match="mixed_precision"):
        plan(PHI, N, 80 * GB, mixed_precision="int4")


def test_pipeline_divides_model_states_by_stages_and_keeps_activations():
    result = plan(PHI, N, 80 * GB, pipeline_stages=4, activation_bytes_per_rank=3 * GB)
    row = result.row("pipeline")
    assert result.pipeline_stages == 4
    assert row.total == 112 * GB / 4 + 3 * GB
    assert all(r.activations == 3 * GB for r in result.rows if r.strategy != "tp_zero3")
    assert "pipeline" not in [r.strategy for r in plan(PHI, N, 80 * GB, pipeline_stages=1).rows]
    auto = plan(PHI, N, 80 * GB)  # fewest stages that fit: 112/2 × 1.1 = 61.6 GB
    assert auto.pipeline_stages == 2
    with pytest.raises(ValueError, match="divide"):
        plan(PHI, N, 80 * GB, pipeline_stages=3)


def test_overhead_factor_decides_fit():
    # ZeRO-3 of 7B on 8: 14 GB. Fits 15 GB at × 1.0 but not at × 1.1.
    assert plan(PHI, N, 15 * GB, overhead=1.0).row("zero3").fits
    assert not plan(PHI, N, 15 * GB, overhead=1.1).row("zero3").fits


@pytest.mark.parametrize(
    "params, world, memory, gather, expected",
    [
        (1 * GB, 1, 80 * GB, 0, "single"),  # 16 GB on one device
        (1 * GB, N, 80 * GB, 0, "ddp"),  # small model → DDP first
        (PHI, N, 80 * GB, 0, "zero2"),  # DDP 112 GB, ZeRO-2 26.25 GB
        (30 * GB, N, 80 * GB, 0, "zero3"),  # ZeRO-2 112.5 GB, ZeRO-3 60 GB
        (30 * GB, N, 60 * GB, 1 * GB, "pipeline"),  # ZeRO-3 61 GB, pipeline(8) 60 GB
        (70 * GB, N, 80 * GB, 0, "zero3_offload"),  # ZeRO-3 140 GB, offload 35 GB
    ],
)
def test_recommendation_follows_the_practice_order(params, world, memory, gather, expected):
    result = plan(params, world, memory, zero3_gather_bytes=gather, overhead=1.0)
    rec = result.recommendation
    assert rec.strategy == expected, rec.reason
    assert rec.row is not None and rec.row.fits
    if expected in ("zero3", "pipeline", "zero3_offload"):
        assert not result.row("zero2").fits


def test_nothing_fits_names_the_smallest():
    result = plan(70 * GB, N, 30 * GB)  # offload smallest: 35 GB
    rec = result.recommendation
    assert rec.strategy == "none" and rec.row is None
    assert "does not fit" in rec.reason and "zero3 + cpu offload" in rec.reason
    assert f"{38.5e9 / 2**30:.1f} GiB per rank" in rec.reason  # offload 35 GB × 1.1


def test_activation_estimate_follows_korthikanti():
    cfg = PRESETS["1b"]
    s, b, h, a, L, V = cfg.seq_len, 2, cfg.dim, cfg.heads, cfg.layers, cfg.vocab_size
    layer = s * b * h * (34 + 5 * a * s / h)
    head = s * b * V * (2 + 4)
    assert activation_bytes(cfg, 2, 2) == int(L * layer + head)
    assert activation_bytes(cfg, 2, 4) == int(2 * L * layer + s * b * V * 4)
    ckpt = activation_bytes(cfg, 2, 2, checkpointing=True)
    assert ckpt == int(L * s * b * h * 2 + layer + head)
    assert ckpt < activation_bytes(cfg, 2, 2) / 5
    no_scores = activation_bytes(cfg, 2, 2, attention_scores=False)
    assert no_scores == int(L * s * b * h * 34 + head)
    assert activation_bytes(cfg, 4, 2) == 2 * activation_bytes(cfg, 2, 2)


def test_gather_bytes_of_the_gpt_units():
    cfg = PRESETS["small"]
    root = (cfg.vocab_size + cfg.seq_len + 2) * cfg.dim
    block = (cfg.num_parameters() - root) // cfg.layers
    assert sum(p.numel() for p in GPT(cfg).blocks[0].parameters()) == block
    assert gpt_gather_bytes(cfg, "bf16") == max(root, block) * 6
    assert gpt_gather_bytes(cfg, "fp32") == max(root, block) * 12


def test_measured_adamw_state_of_tiny_gpt_matches_the_ddp_row():
    """World 1, fp32, AdamW: parameters + grads + exp_avg + exp_avg_sq storages after one step
    against the planner's 4Φ + 4Φ + 8Φ."""
    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    model = GPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    model.loss(tokens, tokens).backward()
    optimizer.step()
    params = list(model.parameters())
    tensors = params + [p.grad for p in params]
    for state in optimizer.state.values():
        tensors += [t for t in state.values() if torch.is_tensor(t) and t.dim() > 0]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    measured = sum(storages.values())
    assert sum(p.numel() for p in params) == cfg.num_parameters()
    row = plan(cfg.num_parameters(), 1, 10 * GB, mixed_precision="fp32").row("ddp")
    predicted = row.parameters + row.gradients + row.optimizer_state
    assert abs(measured - predicted) <= 0.10 * predicted, (measured, predicted)
    assert len(optimizer.state) == len(params)  # every parameter has Adam state


def test_cli_table(capsys):
    assert main(["--params", "7e9", "--gpus", "8", "--gpu-mem", "80"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert lines["ddp"].split()[-2] == "no"
    assert lines["zero2"].split()[-2] == "yes"
    # communication per step: DDP's ring all-reduce of bf16 gradients, 2 (n-1)/n G; ZeRO-2
    # reduce-scatters G and all-gathers P; without the model's shapes tp/pipeline say "?"
    assert lines["ddp"].split()[-1] == f"{2 * 7 / 8 * 14e9 / 2**20:.1f}"
    assert lines["zero2"].split()[-1] == f"{7 / 8 * 28e9 / 2**20:.1f}"
    assert lines["pipeline"].split()[-1] == "?"
    assert f"{126e9 / 2**30:.2f}" in lines["ddp"]  # DDP total 117.35 GiB (16Φ + buckets 2Φ)
    assert "recommendation: zero2" in out
    for label in ("zero1", "fsdp shard_grad_op", "zero3 / fsdp full_shard", "zero3 + cpu"):
        assert label in out


def test_cli_json_with_a_preset(capsys):
    argv = ["--model", "small", "--gpus", "2", "--gpu-mem", "16", "--micro-batch", "4"]
    assert main([*argv, "--seq-len", "128", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cfg = PRESETS["small"]
    assert data["params"] == cfg.num_parameters()
    assert data["world_size"] == 2 and data["device_memory_bytes"] == 16 * 2**30
    rows = {r["strategy"]: r for r in data["rows"]}
    assert rows["ddp"]["activations"] == activation_bytes(cfg, 4, 2, seq_len=128)
    assert rows["zero3"]["gathered"] == gpt_gather_bytes(cfg, "bf16")
    assert data["recommendation"]["strategy"] == "ddp"


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--params", "7e9", "--gpus", "0", "--gpu-mem", "80"], "--gpus"),
        (["--params", "-1", "--gpus", "8", "--gpu-mem", "80"], "--params"),
        (["--params", "7e9", "--gpus", "8", "--gpu-mem", "-80"], "--gpu-mem"),
        (["--model", "huge", "--gpus", "8", "--gpu-mem", "80"], "--model"),
        (["--gpus", "8", "--gpu-mem", "80"], "--params or --model"),
        (["--params", "7e9", "--gpus", "8", "--gpu-mem", "80", "--pipeline-stages", "3"], "divide"),
        (["--params", "7e9", "--gpus", "2.5", "--gpu-mem", "80"], "whole number"),
        (["--params", "7e9", "--gpus", "8", "--gpu-mem", "80", "--gpus-per-host", "3"], "divide"),
    ],
)
def test_cli_bad_arguments_exit_2_naming_the_argument(capsys, argv, names):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert names in err and "error" in err


def test_module_runs_as_a_script():
    argv = ["--params", "1e9", "--gpus", "1", "--gpu-mem", "80", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "shardwise.train.plan_cli", *argv], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["recommendation"]["strategy"] == "single"
    assert "16Φ" in planner.__doc__  # the formulas are documented


def test_cli_plans_a_training_config(capsys):
    """--config: the model, world and precision come from a shardwise-train YAML."""
    from pathlib import Path

    from shardwise.models.gpt import PRESETS

    config = Path(__file__).resolve().parents[2] / "examples" / "configs" / "fsdp.yaml"
    assert main(["--config", str(config), "--gpus", "2", "--gpu-mem", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"] == PRESETS["small"].num_parameters()
    assert out["world_size"] == 2 and out["mixed_precision"] == "bf16"
    assert main(["training.max_steps=3"]) == 2  # overrides without --config


def test_cli_nproc_plans_the_ranks_torchrun_starts_on_this_host(capsys):
    """--nproc N is torchrun --nproc_per_node N's world: N ranks sharing this host's memory (a
    plan of 4 ranks once took the config's world of 1 and each rank's memory as the host's);
    it names a host's ranks, so it is refused beside --gpus or without --config."""
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "ddp.yaml")
    argv = ["--config", config, "--device", "h100", "--json"]
    assert main(argv) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*argv, "--nproc", "4"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert alone["world_size"] == 1
    assert four["world_size"] == 4 and four["ranks_per_host"] == 4
    assert four["device_memory_bytes"] == pytest.approx(alone["device_memory_bytes"] / 4, abs=4)
    assert main([*argv, "--nproc", "4", "--gpus", "4"]) == 2
    assert "--nproc" in capsys.readouterr().err
    assert main(["--params", "1e9", "--nproc", "2"]) == 2
    assert "--nproc needs --config" in capsys.readouterr().err


@pytest.mark.parametrize("preset,micro", [("tiny", 8), ("small", 2)])
def test_the_activation_peak_holds_what_is_saved_and_the_logits_gradient(preset, micro):
    """The planner's activations are the peak of a traced forward + backward, not what autograd
    saves: at the start of backward everything saved is still live beside the logits' gradient
    (batch x sequence x vocabulary floats). Counting the saved bytes alone put GPT small's
    rank 20% under its measured resident set."""
    cfg = PRESETS[preset]
    saved = planner._saved_bytes(cfg, micro, False)
    peak = planner.gpt_activation_bytes(cfg, micro, "fp32")
    logits = micro * cfg.seq_len * cfg.vocab_size * 4
    assert peak >= saved + logits, (peak, saved, logits)
    assert peak < 3 * saved + 3 * logits  # and not everything the step ever allocated


def test_checkpointing_and_bf16_parameters_lower_the_traced_peak():
    """Checkpointing keeps each block's input alone (the trainer's own wrapper,
    ``recompute.checkpoint_blocks``, traced); bf16 parameters without autocast (ZeRO, FSDP's
    mixed precision) store every activation in 2 bytes. Catches a trace that ignores either
    (the planner once priced both as fp32 autocast runs)."""
    cfg, micro = PRESETS["small"], 4
    whole = planner.gpt_activation_bytes(cfg, micro, "fp32")
    checkpointed = planner.gpt_activation_bytes(cfg, micro, "fp32", checkpointing=True)
    assert checkpointed < 0.6 * whole
    autocast = planner.gpt_activation_bytes(cfg, micro, "bf16")
    low = planner.gpt_activation_bytes(cfg, micro, "bf16", low_params=True)
    assert 0.4 * whole < low < autocast < whole


@pytest.mark.parametrize(
    "precision,tp,sequence_parallel", [("fp32", 1, False), ("bf16", 1, False), ("bf16", 2, True)]
)
def test_activations_traced_on_fake_tensors_are_the_real_run_s(precision, tp, sequence_parallel):
    """The planner traces on fake tensors (no memory allocated); every saved storage, and the
    peak of live activations (with checkpointing, with bf16 parameters), must be counted as a
    real forward + backward counts them, byte for byte. Catches a fake trace that drops or
    duplicates storages (fake storages have no data pointer to tell them apart by)."""
    cfg, bf16 = PRESETS["tiny"], precision == "bf16"
    args = (cfg, 2, bf16, tp, sequence_parallel)
    assert planner._saved_bytes(*args) == planner._saved_bytes(*args, fake=False) > 0
    peak = gpt_costs._peak_bytes
    assert peak(*args) == peak(*args, fake=False) > 0
    for checkpointing, low in ((True, False), (False, bf16)):
        keys = {"checkpointing": checkpointing, "low_params": low}
        assert peak(*args, **keys) == peak(*args, fake=False, **keys) > 0


def test_a_262k_vocabulary_model_is_planned_without_allocating_it(tmp_path):
    """gemma3_1b on 8 GPUs: its 262k-vocabulary logits alone are gigabytes per sequence, and the
    planner once ran them for real (23-24 GB resident, killed by the OOM killer). Planned on fake
    tensors it must stay under 2 GiB resident (the process's own peak, from wait4)."""
    import os

    config = Path(__file__).resolve().parents[2] / "examples" / "configs" / "demo.yaml"
    argv = ["--config", str(config), "--gpus", "8", "--gpu-mem", "80", "--json", "model=gemma3_1b"]
    out = tmp_path / "plan.json"
    with out.open("w") as stdout:
        child = subprocess.Popen(
            [sys.executable, "-m", "shardwise.train.plan_cli", *argv], stdout=stdout
        )
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    assert child.returncode == 0
    plan_json = json.loads(out.read_text())
    assert plan_json["params"] > 0.99e9 and plan_json["world_size"] == 8
    assert usage.ru_maxrss * 1024 < 2 * 2**30, f"{usage.ru_maxrss / 2**20:.2f} GiB resident"


def test_tensor_parallelism_comes_after_zero3_when_activations_do_not_fit():
    """Simplest first: single, DDP, FSDP/ZeRO, TP, pipeline. ZeRO-3 shards model states but
    not activations; tp x zero3 with sequence parallelism splits those too."""
    result = plan(PHI, N, 80 * GB, activation_bytes_per_rank=70 * GB)
    tp = result.row("tp_zero3")
    assert not result.row("zero3").fits and tp.fits
    assert tp.activations == 70 * GB / 2 and tp.parameters == result.row("zero3").parameters
    assert result.recommendation.strategy == "tp_zero3"
    assert "tp 2 x zero3 over 4" in result.recommendation.reason
    small = plan(PHI, N, 80 * GB, activation_bytes_per_rank=1 * GB)
    assert small.recommendation.strategy == "zero2"  # nothing new when ZeRO already fits


def test_config_plan_counts_tp_activations_and_traffic():
    """A tp config's plan: activations measured on one tp rank (sequence parallelism splits
    nearly all of them, so about half at tp 2, not the unsplit bytes), and every row's
    communication is its data-axis traffic plus the tp layers' (Megatron-LM's count with SP's
    backward re-gathers, per micro-batch). Catches a planner that plans tp runs as unsplit."""
    from pathlib import Path

    from shardwise.train import gpt_costs
    from shardwise.train.config import load_config

    path = Path(__file__).resolve().parents[2] / "examples" / "configs" / "fsdp_x_tp.yaml"
    cfg = load_config(path, [], env={})
    result = config_plan.plan_for_config(cfg, 2**40)
    gpt = cfg.gpt_config()
    mb = cfg.training.micro_batch_size
    low = config_plan.low_precision_parameters(cfg)  # FSDP's own bf16 parameters
    unsplit = gpt_costs.gpt_activation_bytes(gpt, mb, "bf16", low_params=low)
    split = gpt_costs.gpt_activation_bytes(
        gpt, mb, "bf16", tp=2, sequence_parallel=True, low_params=low
    )
    row = result.row("zero3")
    assert row.activations == split and 0.45 * unsplit < split < 0.6 * unsplit
    tp = gpt_costs.gpt_tp_communication_bytes(gpt, mb, True, 2, 2)
    params = gpt_costs.gpt_tp_parameters(gpt, 2, True)
    # FSDP over 2 ranks: gather bf16 P twice, reduce-scatter G in fp32 (fsdp_reduce_dtype)
    data = 0.5 * (2 * 2 * params + 4 * params)
    assert row.communication == math.ceil(data + tp["total"] + tp["regather"])
    # the same config without tp: no tp traffic, all the activations
    mesh = 'model.mesh_shape=[[4,1],["fsdp","tp"]]'
    flat = load_config(path, [mesh, "distributed.sequence_parallel=false"], env={})
    flat_row = config_plan.plan_for_config(flat, 2**40).row("zero3")
    assert flat_row.activations == unsplit
    assert flat_row.communication == math.ceil(0.75 * (2 * 2 + 4) * gpt.num_parameters())


def test_config_plan_moves_the_dtypes_the_run_communicates_in():
    """The planner's traffic follows what runs under training.mixed_precision=bf16: DDP reduces
    its fp32 gradients (autocast) or, with ddp_comm_hook=bf16, bf16 ones; FSDP gathers bf16
    parameters and reduces fp32 gradients, or fp32 both with fsdp_mixed_precision=false; ZeRO
    gathers bf16 parameters and reduces bf16 gradients at stage 2, fp32 ones at stage 3. Over
    gloo those are the bytes; the shardwise backend's CPU collectives carry every 16-bit
    reduction in float32. Catches a plan that counts bf16 traffic for collectives that run in
    fp32, on the link or in the engine."""
    from conftest import load_train_config as load

    def comm(row, *overrides):
        cfg = load("training.mixed_precision=bf16", "distributed.world_size=2", *overrides)
        return config_plan.plan_for_config(cfg, 2**40).row(row).communication

    phi = load().gpt_config().num_parameters()
    gloo = "distributed.backend=gloo"
    ddp = ("distributed.strategy=ddp", "training.gradient_accumulation_steps=1")
    r = (2 - 1) / 2  # world 2: a rank sends (n-1)/n of what it reduces or gathers
    assert comm("ddp", *ddp) == math.ceil(2 * r * 4 * phi)
    assert comm("ddp", *ddp, "distributed.ddp_comm_hook=bf16", gloo) == math.ceil(2 * r * 2 * phi)
    assert comm("ddp", *ddp, "distributed.ddp_comm_hook=bf16") == math.ceil(2 * r * 4 * phi)
    fsdp = ("distributed.strategy=fsdp", "training.gradient_accumulation_steps=1")
    assert comm("zero3", *fsdp) == math.ceil(r * (2 * 2 * phi + 4 * phi))
    off = "distributed.fsdp.fsdp_mixed_precision=false"
    assert comm("zero3", *fsdp, off) == math.ceil(r * (2 * 4 * phi + 4 * phi))
    zero = "distributed.strategy=zero"
    for backend in ((), (gloo,)):
        assert comm("zero3", zero, *backend) == math.ceil(r * (2 * 2 * phi + 4 * phi))
    assert comm("zero2", zero, gloo) == math.ceil(r * (2 * phi + 2 * phi))
    assert comm("zero2", zero) == math.ceil(r * (2 * phi + 4 * phi))


def test_processes_per_node_decide_each_ranks_share_of_the_host(capsys):
    """distributed.num_nodes and num_processes_per_node, as the trainer's memory check reads
    them: two ranks on one host (the default for world 2) each plan with half this host's
    memory; on two nodes of one process (either key says so) each plans with all of it."""
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "ddp.yaml")

    def memory(*overrides: str) -> int:
        argv = ["--config", config, "distributed.world_size=2", *overrides, "--json"]
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)["device_memory_bytes"]

    shared = memory()
    assert memory("distributed.num_nodes=2") == 2 * shared
    assert memory("distributed.num_processes_per_node=1") == 2 * shared
    assert memory("distributed.num_processes_per_node=2") == shared


def test_across_hosts_bytes_per_host_link_and_the_hybrid_row():
    """7B in bf16 on 2 hosts x 8: each row's bytes per host link are the rank-level formulas
    with the hosts for the ranks (the backend's hierarchical collectives: one ring per local
    rank across hosts); FSDP hybrid_shard holds 16Φ/8 and sends DDP's inter-host bytes. Catches
    the hybrid row sharded over the world, or ZeRO-3 priced at hybrid's inter-host bytes."""
    result = plan(PHI, 16, 80 * GB, ranks_per_host=8)
    p = g = 2 * PHI  # bf16 parameters and gradients
    expected = {"ddp": g, "zero2": (p + g) / 2, "zero3": (2 * p + g) / 2}
    expected.update(fsdp_hybrid_shard=g, zero3_offload=(2 * p + g) / 2)
    for name, bytes_ in expected.items():
        assert result.row(name).inter_host == bytes_, name
    assert result.row("pipeline").inter_host is None  # placement of stages not known
    hybrid = result.row("fsdp_hybrid_shard")
    assert (hybrid.parameters, hybrid.gradients, hybrid.optimizer_state) == (
        p / 8,
        g / 8,
        12 * PHI / 8,
    )
    # per rank: within the host (7/8)(2P + G), then its G/8 shard all-reduced over 2 replicas
    assert hybrid.communication == 7 / 8 * (2 * p + g) + g / 8
    assert result.ranks_per_host == 8
    one_host = plan(PHI, 16, 80 * GB)
    assert all(r.inter_host is None for r in one_host.rows)
    assert "fsdp_hybrid_shard" not in [r.strategy for r in one_host.rows]
    with pytest.raises(ValueError, match="ranks_per_host=3 must be >= 1 and divide"):
        plan(PHI, 16, 80 * GB, ranks_per_host=3)


@pytest.mark.parametrize(
    "params, per_host, expected",
    [
        (PHI, 16, "zero2"),  # one host: the practice order
        (PHI, 8, "fsdp_hybrid_shard"),  # two hosts: hybrid right after DDP
        (1 * GB, 8, "ddp"),  # DDP fits: simplest, and hybrid's inter-host bytes
        (60 * GB, 8, "zero3"),  # hybrid 16Φ/8 = 120 GB does not fit, zero3 60 GB does
    ],
)
def test_across_hosts_the_planner_recommends_hybrid_shard(params, per_host, expected):
    result = plan(params, 16, 80 * GB, ranks_per_host=per_host, overhead=1.0)
    rec = result.recommendation
    assert rec.strategy == expected, rec.reason
    if expected == "fsdp_hybrid_shard":
        assert "2 hosts of 8 ranks" in rec.reason
        zero3 = result.row("zero3").inter_host / 2**20
        assert f"{rec.row.inter_host / 2**20:.1f} MiB per host link" in rec.reason
        assert f"zero3 / full_shard sends {zero3:.1f} MiB" in rec.reason


def test_cli_across_hosts_prints_the_host_link_column(capsys):
    argv = ["--params", "7e9", "--gpus", "16", "--gpu-mem", "80", "--gpus-per-host", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "16 GPUs on 2 hosts x 8" in out and "host link MiB" in out
    line = next(x for x in out.splitlines() if x.startswith("fsdp hybrid_shard"))
    assert line.split()[-1] == f"{2 * PHI / 2**20:.1f}"  # DDP's bytes: 2(H-1)/H·G = G (bf16)
    assert "recommendation: fsdp_hybrid_shard" in out


def test_config_across_nodes_plans_the_run_s_hybrid_mesh(capsys):
    """distributed.num_nodes gives the hosts; bytes per host link in the dtypes FSDP moves
    (bf16 gathers, fp32 reductions): hybrid_shard all-reduces fp32 gradients, 2(H-1)/H·4Φ,
    full_shard gathers bf16 parameters in the forward and backward of each of 2 micro-batches
    and reduce-scatters once, (H-1)/H·(2·2Φ·2 + 4Φ). A hybrid_shard run's memory check reads the
    hybrid row (sharded over the host's 4 ranks), not full_shard's over the world of 8."""
    from pathlib import Path

    from shardwise.train import api
    from shardwise.train.config import load_config

    config = Path(__file__).resolve().parents[2] / "examples" / "configs" / "fsdp.yaml"
    keys = ["distributed.world_size=8", "distributed.num_nodes=2"]
    keys += ["training.gradient_accumulation_steps=2"]
    assert main(["--config", str(config), *keys, "--gpu-mem", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows, phi = {r["strategy"]: r for r in out["rows"]}, out["params"]
    assert out["ranks_per_host"] == 4
    assert rows["fsdp_hybrid_shard"]["parameters"] == math.ceil(rows["ddp"]["parameters"] / 4)
    assert rows["fsdp_hybrid_shard"]["inter_host"] == math.ceil(4 * phi)
    assert rows["zero3"]["inter_host"] == math.ceil((2 * 2 * phi * 2 + 4 * phi) / 2)
    hybrid = [*keys, "distributed.fsdp_sharding_strategy=hybrid_shard"]
    fits, text = api.memory_check(load_config(str(config), hybrid, env={}), 16 * 2**30)
    assert fits and "memory per rank (fsdp hybrid_shard)" in text
