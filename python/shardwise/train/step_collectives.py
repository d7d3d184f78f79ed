"""The collectives one rank runs in one optimizer step, per planned row: what its engine, its
model and the trainer each call, as ``(kind, ranks, hosts, count)``, so that
``collective_latency.Latency`` can price each one's wait (``step_time.py`` adds it to the row's
communication). The counts are the engines' own rules, and ``tests/distributed`` compares them
with the shardwise backend's counters of a real run (``training.profile_communication``).

With m micro-batches per step, n ranks on the row's data axis, U wrapped units (each
transformer block and the root, the trainer's transformer-block wrapping):

- the model's own collectives (a tensor-parallel rank's all-reduces, gathers and scatters) are
  traced with its micro-batch (``op_trace.Trace.collectives``): m times, and once more per
  micro-batch for the forward activation checkpointing runs again;
- DDP: one all-reduce per gradient bucket, in the last micro-batch (the others run under
  ``no_sync``); the buckets are torch's own assignment (``_compute_bucket_assignment_by_size``
  at DDP's default caps, the parameters in the reverse order their gradients arrive in);
- the ZeRO engine: a reduce-scatter per reduce bucket in every micro-batch (it reduces into its
  partition each time), an all-gather per all-gather bucket after the update (its buckets:
  parameters in order until the next one would pass ``reduce_bucket_size`` /
  ``allgather_bucket_size``, the rule of C++ ``zero::ZeroOptimizer``);
- FSDP full_shard / ZeRO-3: each micro-batch gathers the U units in its forward and all but the
  root again in its backward (the root keeps its parameters between them), and the last one
  reduce-scatters the U units' gradients (the ZeRO engine's stage 3: every one, as its
  stages 1 and 2 do); shard_grad_op gathers each unit once per
  micro-batch; hybrid_shard adds an all-reduce per unit across its replicas;
- a pipeline: each message between stages is two (its header, then its tensor): per
  micro-batch, an activation forward and a gradient back over each boundary the stage has, plus
  the tied embedding's gradient between the first and last stage; each run of the schedule
  (one per accumulated batch) sends that gradient and averages the stage's gradients over the
  replicas in one all-reduce (per dtype);
- the trainer: the loss's mean over the data replicas (one all-reduce), a pipeline's loss over
  its stages, and the gradient norm over every axis the rank's parameters are split on (one
  all-reduce each: FSDP's and ZeRO's shards, tp, the pipeline's stages).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# rows whose gradient norm is summed over the data axis's shards
SHARDED_DATA = (
    "zero1", "zero2", "zero3", "zero3_offload", "fsdp_shard_grad_op", "fsdp_hybrid_shard",
    "tp_zero3",
)  # fmt: skip


@dataclass(frozen=True)
class Collective:
    kind: str
    ranks: int
    hosts: int
    count: int


@dataclass(frozen=True)
class EngineCounts:
    """What sets a step's collectives, read from the model and the engines' settings."""

    units: int = 1  # FSDP / ZeRO-3 units: blocks + root
    ddp_buckets: int = 1
    zero_reduce_buckets: int = 1
    zero_gather_buckets: int = 1
    # one traced micro-batch's own collectives: (kind, ranks) -> count; and its forward's
    model: dict = field(default_factory=dict)
    recomputed: dict = field(default_factory=dict)
    tied_embedding: bool = True  # the model shares a parameter (the head tied to the embedding)
    pipeline_runs: int = 1  # the pipeline's schedule runs per step (gradient accumulation)
    # the ZeRO engine reduces into its partition in every micro-batch (stage 3 too); torch
    # FSDP and DDP only in the last one (no_sync)
    zero_engine: bool = False


def _data_axis(strategy: str, e: EngineCounts, n: int, m: int) -> Counter:
    """(kind, ranks) -> count of the data axis's collectives (module docstring)."""
    c = Counter()
    if n <= 1:
        return c
    u = e.units
    if strategy == "ddp":
        c["all_reduce", n] += e.ddp_buckets
    elif strategy in ("zero1", "zero2"):
        c["reduce_scatter", n] += e.zero_reduce_buckets * m
        c["all_gather", n] += e.zero_gather_buckets
    elif strategy == "fsdp_shard_grad_op":
        c["all_gather", n] += u * m
        c["reduce_scatter", n] += u
    elif strategy in ("zero3", "zero3_offload", "fsdp_hybrid_shard", "tp_zero3"):
        c["all_gather", n] += (2 * u - 1) * m
        c["reduce_scatter", n] += u * (m if e.zero_engine else 1)
    return c


def step_collectives(
    strategy: str,
    e: EngineCounts,
    *,
    ranks: int,
    micro_batches: int,
    stages: int = 1,
    tp: int = 1,
    hosts: int = 1,
    checkpointing: bool = False,
    shard_group: int | None = None,
) -> list[Collective]:
    """The collectives of one rank of ``strategy``'s row over ``ranks`` ranks (the planner's
    row ranks: a pipeline's stages and the tp_zero3 row's tp ranks included; a model traced
    tensor-parallel brings its own tp collectives) in one step of ``micro_batches``
    micro-batches; the data axis spans ``hosts`` hosts, tp and the pipeline stay within one.
    ``shard_group``: hybrid_shard's shard group (default: a host's ranks)."""
    m = micro_batches
    pipelined = strategy == "pipeline" and stages > 1
    split = tp if strategy == "tp_zero3" else 1
    n = ranks // (stages if pipelined else split)  # the data axis
    out: list[Collective] = []

    def add(counts: Counter, over_hosts: int):
        out.extend(Collective(k, r, over_hosts, v) for (k, r), v in counts.items() if v)

    per_host = max(1, n // hosts)
    data_n = n
    if strategy == "fsdp_hybrid_shard":
        data_n = shard_group or per_host
        add(Counter({("all_reduce", n // data_n): e.units}), hosts)
    add(_data_axis(strategy, e, data_n, m), 1 if strategy == "fsdp_hybrid_shard" else hosts)
    if pipelined:
        runs = e.pipeline_runs
        add(Counter({("all_reduce", n): runs}) if n > 1 else Counter(), hosts)
        boundaries = 1 if stages == 2 else 2  # the busiest stage's (a middle one's)
        messages = 2 * m * boundaries + int(e.tied_embedding) * runs
        add(Counter({("send", stages): 2 * messages, ("all_reduce", stages): 2}), 1)
    model = Counter(e.model)  # a tp rank's own, traced: every row of a tp model runs them
    if checkpointing:
        model.update(e.recomputed)
    add(Counter({k: v * m for k, v in model.items()}), 1)
    tp_group = max((r for _, r in e.model), default=split)
    if tp_group > 1:
        add(Counter({("all_reduce", tp_group): 1}), 1)  # the norm over tp
    trainer = Counter()
    if n > 1:
        trainer["all_reduce", n] += 1  # the loss's mean
        if strategy in SHARDED_DATA:
            trainer["all_reduce", data_n] += 1  # the norm over the shards
    add(trainer, hosts)
    return out


def latency_seconds(collectives: list[Collective], latency) -> float:
    """The step's wait on its collectives beyond their bytes (``collective_latency``)."""
    return sum(c.count * latency.seconds(c.kind, c.ranks, c.hosts) for c in collectives)


def per_kind(collectives: list[Collective]) -> dict[str, int]:
    """Calls per kind, as the backend's counters name them (a send as ``send/recv``)."""
    out: Counter = Counter()
    for c in collectives:
        if c.ranks > 1:
            out["send/recv" if c.kind == "send" else c.kind] += c.count
    return dict(out)
