"""Step time of each planned strategy (``planner.Plan``'s rows), from a cost model: the
operators of one traced micro-batch (``op_trace.py``) priced on a device (``calibration.py``),
the optimizer's update, and each row's communication over a cluster's links.

Per rank and optimizer step, with m micro-batches, T the traced forward + backward of one
micro-batch (F its forward alone) and A = T + F under activation checkpointing, else T:

- one operator costs ``max(flops / matmul rate, bytes / memory bandwidth) + op_seconds`` (a
  roofline, plus the fixed cost of dispatching it); T and F are the sums over the trace;
- compute: ``m · A`` for the data-parallel rows; ``m · A / t`` for the tp x zero3 row of degree t
  when the traced model is not already cut; a pipeline of p stages runs its schedule over
  each stage's own traced cost (``stage_costs.py``: the simulator's makespan, the slowest stage
  setting the pace), or, where the stages were not traced (a cut by measured time, which
  balances them; tensor parallelism inside the stages), ``(m + p - 1)`` stage slots of ``A / p``
  (the fill and drain are its bubble);
- optimizer: the parameters this rank updates (its optimizer state over the bytes each
  parameter holds there), each moving the bytes an update reads and writes (AdamW: parameter,
  gradient and two moments read, three written, 28 bytes in fp32; SGD with momentum 20; a
  low-precision copy written adds 2), priced by ``DeviceRates.update_seconds``: on the CPU at
  the measured rate of the step's own clip and fused AdamW, plus a fixed cost per tensor it
  steps (the module's parameter tensors, a pipeline stage's share of them, or ZeRO's one flat
  partition), on a GPU over the memory bandwidth;
- communication: the row's ring bytes per rank (``Row.communication``) over the bus bandwidth
  within a host, plus, across hosts, its bytes per host link (``Row.inter_host``) over the
  link's; the hierarchical collectives run those phases one after the other; plus each
  collective's latency beyond its bytes: the collectives the row's rank runs per step, as its
  engine, its model and the trainer call them (``step_collectives.py``), each at NCCL's ring
  latency over its group (``collective_latency.py``: NCCL's table on a GPU, this CPU's
  measured ring step and message);
- overlap: on a GPU the engines hide communication behind compute, DDP and ZeRO-1/2 behind
  the backward (taken as 2/3 of the compute), ZeRO-3 / FSDP full_shard and hybrid_shard behind
  forward and backward (the prefetched gathers); only the rest is exposed. On the CPU the
  collectives copy with the cores that compute, so all of it is added;
- ranks that outnumber a host's cores (CPU) take turns: compute and communication's bytes
  stretch by ``ranks x threads / cores`` (the latency does not: it is a wait, not work).

``step_s = compute_s + optimizer_s + exposed communication``, and tokens/s is the tokens the
row's replicas train per step over it: every row runs the same micro-batches per replica, so a
tp or pipeline row, whose t or p ranks hold one replica, trains 1/t or 1/p of DDP's tokens.
Not modelled: stragglers and the data loader.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .calibration import ADAMW_UPDATE_BYTES, DeviceRates
from .collective_latency import Latency
from .op_trace import Trace
from .step_collectives import EngineCounts, latency_seconds, per_kind, step_collectives

# bytes an optimizer update reads and writes per parameter (fp32 states; module docstring)
UPDATE_BYTES = {"adamw": ADAMW_UPDATE_BYTES, "adam": ADAMW_UPDATE_BYTES, "sgd": 20}
_HIDE_BEHIND = {"ddp": 2 / 3, "zero1": 2 / 3, "zero2": 2 / 3, "fsdp_shard_grad_op": 2 / 3}


@dataclass(frozen=True)
class Links:
    """The bandwidths a rank's collectives see: within its host (bus bandwidth, bytes/s) and
    over its host's link to the others (bytes/s; None: one host); and the latency of each
    collective beyond its bytes (``collective_latency.Latency``; None: not priced)."""

    intra_host: float
    inter_host: float | None = None
    latency: Latency | None = None


@dataclass(frozen=True)
class StepTime:
    """One row's predicted step, in the names the run's records use."""

    strategy: str
    step_s: float
    tokens_per_s: float
    compute_s: float
    comm_s: float  # all of the row's communication; exposed_comm_s is what the step waits for
    exposed_comm_s: float
    optimizer_s: float
    latency_s: float = 0.0  # the part of comm_s its collectives wait beyond their bytes
    # calls per step by kind, as the backend's counters name them (step_collectives.per_kind)
    collectives: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def trace_seconds(trace: Trace, rates: DeviceRates) -> float:
    """The trace's roofline (``Trace.roofline_seconds``) plus each operator's fixed cost."""
    return trace.roofline_seconds(rates) + len(trace) * rates.op_seconds


@dataclass(frozen=True)
class Work:
    """What every row of one plan shares: seconds of one micro-batch's forward + backward
    (``micro_batch_s``: with checkpointing's second forward included) on one rank, the
    micro-batches each replica runs per step, the tokens one replica trains per step, the bytes
    an optimizer update moves per parameter, and the tp degree the traced model already has."""

    micro_batch_s: float
    micro_batches: int
    tokens_per_replica: int
    update_bytes: int
    traced_tp: int = 1
    # a pipeline's compute per step when its stages were priced one by one: its schedule's
    # makespan over them (``stage_costs.pipeline_makespan``); None: stages of equal cost
    pipeline_s: float | None = None
    # the model's parameter tensors (the optimizer's fixed cost is per tensor), and whether the
    # engine steps one flat partition of them instead (the ZeRO engine)
    parameter_tensors: int = 0
    flat_update: bool = False
    # what sets the step's collectives (``step_collectives.EngineCounts``; None: their
    # latency is not priced) and whether checkpointing runs each forward again
    engine: EngineCounts | None = None
    checkpointing: bool = False

    def update_tensors(self, strategy: str, stages: int) -> int:
        """The tensors one rank's optimizer steps: one flat partition, a pipeline stage's share
        of the parameter tensors, or all of them."""
        if self.flat_update:
            return 1
        if strategy == "pipeline" and stages > 1:
            return -(-self.parameter_tensors // stages)
        return self.parameter_tensors


def _compute(strategy: str, work: Work, stages: int, tp: int) -> float:
    m, a = work.micro_batches, work.micro_batch_s
    if strategy == "pipeline" and stages > 1 and work.pipeline_s is not None:
        return work.pipeline_s
    if strategy == "pipeline" and stages > 1:
        return (m + stages - 1) * a / stages
    if strategy == "tp_zero3" and work.traced_tp == 1:
        return m * a / tp
    return m * a


def _replicas(strategy: str, ranks: int, stages: int, tp: int) -> int:
    """Model replicas among the plan's ``ranks`` data ranks: a pipeline's p stages or a tp row's
    t ranks hold one replica together."""
    if strategy == "pipeline" and stages > 1:
        return ranks // stages
    return ranks // tp if strategy == "tp_zero3" else ranks


def predict_row(
    row,
    work: Work,
    rates: DeviceRates,
    links: Links,
    *,
    optimizer_bytes_per_param: float,
    ranks: int,
    stages: int = 1,
    tp: int = 1,
    contention: float = 1.0,
    hosts: int = 1,
) -> StepTime | None:
    """The step time of one ``planner.Row`` over ``ranks`` data ranks; None when its
    communication is not known. Every row runs the same micro-batches per replica (the
    planner's convention), so its tokens per step are its replicas' (``_replicas``)."""
    if row.communication is None:
        return None
    compute = _compute(row.strategy, work, stages, tp) * contention
    state = row.optimizer_state or row.host  # offload keeps the optimizer state on the host
    updated = state / optimizer_bytes_per_param if optimizer_bytes_per_param else 0.0
    tensors = work.update_tensors(row.strategy, stages) if updated else 0
    optimizer = rates.update_seconds(updated, tensors, work.update_bytes) * contention
    comm = row.communication / links.intra_host
    if row.inter_host and links.inter_host:
        comm += row.inter_host / links.inter_host
    latency, calls = _latency(row.strategy, work, links, ranks, stages, tp, hosts)
    comm = comm * contention + latency
    exposed = comm
    if rates.overlaps_communication:
        hidden = _HIDE_BEHIND.get(row.strategy, 1.0 if row.strategy != "pipeline" else 0.0)
        exposed = max(0.0, comm - hidden * compute)
    step = compute + optimizer + exposed
    tokens = _replicas(row.strategy, ranks, stages, tp) * work.tokens_per_replica
    return StepTime(
        row.strategy, step, tokens / step, compute, comm, exposed, optimizer, latency, calls
    )


def _latency(strategy, work: Work, links: Links, ranks, stages, tp, hosts) -> tuple[float, dict]:
    """Seconds the row's collectives wait beyond their bytes (``step_collectives.py``), and
    its calls per kind."""
    if work.engine is None:
        return 0.0, {}
    calls = step_collectives(
        strategy, work.engine, ranks=ranks, micro_batches=work.micro_batches, stages=stages,
        tp=tp, hosts=hosts, checkpointing=work.checkpointing,
    )  # fmt: skip
    seconds = latency_seconds(calls, links.latency) if links.latency is not None else 0.0
    return seconds, per_kind(calls)


def cpu_contention(
    ranks_per_host: int, threads: int, cores: int | None = None, penalty: float = 1.0
) -> float:
    """How much longer everything takes when a host's ranks' threads outnumber its cores: their
    turns, times the measured ``penalty`` of taking them (``oversubscription.contention``)."""
    from .device import host_cores
    from .oversubscription import contention

    cores = cores or host_cores()
    return contention(ranks_per_host * threads / cores, penalty)


def rank_rows(times: dict[str, StepTime | None], fits: dict[str, bool]) -> list[str]:
    """The strategies that fit, fastest first (by predicted tokens/s)."""
    known = [t for name, t in times.items() if t is not None and fits.get(name)]
    return [t.strategy for t in sorted(known, key=lambda t: -t.tokens_per_s)]


def predict_plan(
    plan, work: Work, rates: DeviceRates, links: Links, contention: float = 1.0
) -> dict[str, StepTime | None]:
    """Every row's step time (``predict_row``), by strategy."""
    from .planner import optimizer_bytes_per_param

    return {
        row.strategy: predict_row(
            row,
            work,
            rates,
            links,
            optimizer_bytes_per_param=optimizer_bytes_per_param(
                row.strategy, plan.mixed_precision, plan.optimizer
            ),
            ranks=plan.world_size,
            stages=plan.pipeline_stages,
            tp=plan.tp_degree,
            contention=contention,
            hosts=plan.hosts,
        )
        for row in plan.rows
    }


def update_bytes(optimizer: str, precision: str) -> int:
    """Bytes an optimizer update reads and writes per parameter (module docstring)."""
    return UPDATE_BYTES[optimizer] + (2 if precision != "fp32" else 0)
