"""The collectives' latency in the step-time model: NCCL's ring model (``collective_latency.py``),
the collectives a row runs per step (``step_collectives.py``; the distributed test compares
them with real runs), the model's own collectives in the operator trace, the cluster file's
latency keys, and the latency reaching a row's communication (``step_time.py``)."""

from collections import Counter
from pathlib import Path

import pytest
from shardwise.train import calibration, planner, prediction, step_time
from shardwise.train.cluster import load_cluster
from shardwise.train.collective_latency import Latency, latency_for
from shardwise.train.config import load_config
from shardwise.train.gpt_costs import engine_counts, gpt_traces
from shardwise.train.step_collectives import EngineCounts, per_kind, step_collectives

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
US = 1e-6


def test_a_ring_waits_nccl_s_base_plus_a_step_per_rank_and_host():
    """NCCL's ring / Simple figures: an all-reduce of 8 H100s on one host takes 14 steps over
    NVLink; across 2 hosts of 8, 30 steps of which 2 cross the network; a reduce-scatter half
    the steps; one rank waits for nothing. Catches a count of steps that ignores the hosts (the
    network step is ~3x NVLink's) or charges a group of one."""
    h100 = latency_for("h100")
    assert h100.seconds("all_reduce", 8) == pytest.approx((8.4 + 14 * 3.4) * US)
    assert h100.seconds("all_reduce", 16, hosts=2) == pytest.approx((8.4 + 28 * 3.4 + 2 * 9.6) * US)
    assert h100.seconds("reduce_scatter", 16, hosts=2) == pytest.approx((8.4 + 14 * 3.4 + 9.6) * US)
    assert h100.seconds("all_gather", 1) == 0.0
    assert latency_for("l40s").seconds("send", 2) == pytest.approx((8.4 + 5.7) * US)
    with pytest.raises(ValueError, match="scatter_v"):
        h100.seconds("scatter_v", 8)


def test_the_cpu_s_latency_is_its_measured_step_and_message_and_a_cluster_overrides_them():
    cpu = latency_for("cpu", 5e-6, 8e-5)
    assert cpu.seconds("all_reduce", 4) == pytest.approx(6 * 5e-6)
    assert cpu.seconds("send", 2) == pytest.approx(8e-5)  # its own path, measured apart
    assert cpu.seconds("send", 4, hosts=2) == pytest.approx(50 * US)  # across: TCP's
    given = latency_for("h200", intra_host_us=2.0, inter_host_us=20.0)
    assert given == Latency(8.4 * US, 2.0 * US, 20.0 * US)


def test_the_cluster_file_s_latency_keys_are_read_and_checked(tmp_path):
    path = tmp_path / "cluster.yaml"
    base = "device: h100\nhosts: 2\ngpus_per_host: 8\ngpu_mem_gib: 80\n"
    path.write_text(base + "intra_host_latency_us: 2.5\ninter_host_latency_us: 12\n")
    cluster = load_cluster(str(path))
    assert (cluster.intra_host_latency_us, cluster.inter_host_latency_us) == (2.5, 12.0)
    path.write_text(base + "inter_host_latency_us: -1\n")
    with pytest.raises(ValueError, match="inter_host_latency_us must be a number > 0"):
        load_cluster(str(path))


def test_a_tp_rank_s_trace_records_its_collectives_apart_from_its_compute():
    """The fsdp x tp config's tp rank (sequence parallel, 2 blocks): its own gathers and
    scatters, over its tp group of 2, counted by kind, and none priced as an operator. Catches
    collectives left among the roofline's operators (priced as memory traffic) or counted
    over the wrong group."""
    cfg = load_config(str(CONFIGS / "fsdp_x_tp.yaml"), [], env={"WORLD_SIZE": "4"})
    full, forward = gpt_traces(cfg.gpt_config(), 8, True, 2, True, False)
    kinds = Counter(full.collectives)
    assert set(kinds) == {("all_gather", 2), ("reduce_scatter", 2), ("all_reduce", 2)}
    assert kinds["all_gather", 2] > kinds["reduce_scatter", 2] > 0
    assert sum(Counter(forward.collectives).values()) < sum(kinds.values())
    assert not [op for op in full.ops if op.name.startswith("c10d.")]


def test_each_engine_s_collectives_grow_with_what_it_repeats():
    """Per step at 4 micro-batches, 8 ranks, 13 units: DDP reduces its buckets once, ZeRO-2
    reduce-scatters every micro-batch, full_shard gathers 2U-1 units per micro-batch, and a
    4-stage pipeline's middle stage sends over two boundaries. Catches a count that treats
    accumulation as one micro-batch."""
    e = EngineCounts(units=13, ddp_buckets=5, zero_reduce_buckets=2, zero_gather_buckets=3)
    count = {s: per_kind(step_collectives(s, e, ranks=8, micro_batches=4)) for s in
             ("ddp", "zero2", "zero3")}  # fmt: skip
    assert count["ddp"] == {"all_reduce": 5 + 1}
    assert count["zero2"] == {"reduce_scatter": 8, "all_gather": 3, "all_reduce": 2}
    assert count["zero3"] == {"all_gather": 25 * 4, "reduce_scatter": 13, "all_reduce": 2}
    pipe = per_kind(step_collectives("pipeline", e, ranks=8, micro_batches=4, stages=4))
    assert pipe["send/recv"] == 2 * (2 * 4 * 2 + 1)


def test_ddp_s_buckets_are_torch_s_own_assignment():
    """GPT small's fp32 gradients (about 0.5 GB) in torch DDP's default buckets: a 1 MiB first
    one, then 25 MiB each. Catches a bucket count taken as bytes / cap (torch never splits a
    tensor, so a large embedding fills a bucket of its own)."""
    cfg = load_config(str(CONFIGS / "ddp.yaml"), ["model.preset=small"], env={"WORLD_SIZE": "2"})
    gpt = cfg.gpt_config()
    full, forward = gpt_traces(gpt, 1, False)
    counts = engine_counts(gpt, full, forward)
    assert counts.units == gpt.layers + 1 and counts.model == {}
    assert 4 * gpt.num_parameters() / (25 * 2**20) < counts.ddp_buckets < 76


def test_the_latency_is_part_of_a_row_s_communication_and_grows_with_the_cluster():
    """The same FSDP config on 8 and on 512 H100s: the ring's steps grow with the ranks, so the
    latency a step waits grows too, inside comm_s. Catches latency charged per collective but
    not per ring step, or left out of the communication the overlap rule sees."""
    cfg = load_config(str(CONFIGS / "fsdp.yaml"), [], env={"WORLD_SIZE": "8"})
    waits = []
    for gpus in (8, 512):
        plan = planner.plan(
            cfg.gpt_config().num_parameters(), gpus, 80 * 2**30, ranks_per_host=8,
            micro_batches=1, mixed_precision="bf16",
        )  # fmt: skip
        times = prediction.for_gpt(
            plan, cfg.gpt_config(), micro_batch_size=4, checkpointing=True,
            strategy="zero3", device="h100",
        ).times  # fmt: skip
        waits.append(times["zero3"].latency_s)
        assert 0 < times["zero3"].latency_s < times["zero3"].comm_s
    assert waits[1] > 20 * waits[0]


def test_no_latency_table_prices_nothing_but_still_counts():
    links = step_time.Links(1e10)
    row = planner.Row("ddp", "ddp", 0, 0, 0, 0, 0, 0, 0, True, 0, 0, None)
    work = step_time.Work(1.0, 2, 100, 28, engine=EngineCounts(ddp_buckets=3))
    t = step_time.predict_row(row, work, calibration.gpu_rates("h100"), links,
                              optimizer_bytes_per_param=12, ranks=2)  # fmt: skip
    assert t.latency_s == 0.0 and t.collectives == {"all_reduce": 4}
