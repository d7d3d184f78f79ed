"""Per-rank memory planner (``shardwise-plan``, or ``python -m shardwise.train.planner``).

Estimates, before anything is launched, the bytes each rank holds for parameters, gradients,
optimizer state and activations under each parallel strategy, says which fit a device, and
recommends the simplest strategy that fits.

Model states (ZeRO paper, Rajbhandari et al. 2019, arXiv 1910.02054, section 3.1 / 5; checked
against this codebase's ZeRO in ``benchmarks/results/2026-11-23-zero-cpu.md``). With Φ
parameters, N data-parallel ranks and Adam(W):

- mixed precision (bf16 or fp16): 2Φ low-precision parameters, 2Φ gradients and K = 12 bytes
  per parameter of optimizer state (fp32 master copy 4Φ + first and second moments 4Φ + 4Φ);
- fp32 training: 4Φ parameters, 4Φ gradients, 8Φ optimizer state (the two moments); ZeRO 1/2
  step a flat fp32 partition, a copy even in fp32, so their rows hold 12Φ / N.
- SGD with momentum keeps one fp32 buffer instead of two moments (K = 8 mixed, 4 in fp32).

Per rank, with P, G, O the unsharded parameter, gradient and optimizer bytes:

====================================  ============  ============  ============
strategy                              parameters    gradients     optimizer
====================================  ============  ============  ============
ddp (single device when N = 1)        P             G             O
zero1                                 P             G             O / N
zero2, fsdp shard_grad_op             P             G / N         O / N
zero3, fsdp full_shard                P / N         G / N         O / N
pipeline, p stages, dp = N / p        P / p         G / p         O / p
zero3 + cpu offload                   P / N         G / N         0 (O / N on host)
fsdp hybrid_shard, S ranks per shard  P / S         G / S         O / S
====================================  ============  ============  ============

So with bf16 + Adam: DDP 16Φ, ZeRO-1 4Φ + 12Φ/N, ZeRO-2 2Φ + 14Φ/N, ZeRO-3 16Φ/N. The
offload row assumes the optimizer state (master weights and moments) lives in host memory and
the device keeps its parameter and gradient shards (DeepSpeed's ``offload_optimizer``);
shardwise's stage-3 ``cpu_offload`` also moves the shards, so it needs even less device memory.

ZeRO-3 / FSDP full_shard (and its offload variant) also hold the unsharded units they gather
(``zero3_gather_bytes``; for the bundled GPT ``gpt_gather_bytes``: the largest wrapped unit
twice, for the prefetch, in the parameter dtype plus once in the gradient dtype); DDP holds its
gradient buckets, one more G (torch DDP with ``gradient_as_bucket_view`` off, as the trainer
builds it). Both are the row's ``gathered`` bytes.

Activations are per microbatch and per rank (``activation_bytes_per_rank``: for the bundled
GPT and a config's model ``gpt_activation_bytes``, the peak of a traced forward + backward);
pipeline stages under 1F1B hold up to p microbatches of L / p layers on the first stage, i.e.
about one whole-model microbatch, so the pipeline row uses the same activation bytes. What else
an allocator holds (its fragmentation, communication staging) is covered by the overhead
factor: a row fits when ``total × overhead ≤ device memory`` (rule of thumb "params × bytes ×
overhead" from the practice notes).

Communication per rank and optimizer step (``Row.communication``, ring traffic): the data axis's
collectives from the state sizes, in the dtypes each row moves (``communicated_bytes_for_config``:
DDP's fp32 gradients under autocast, FSDP's param and reduce dtypes), plus tensor parallelism's
(``gpt_costs``) and the pipeline's stage messages when the model's shapes are known
(``plan_for_config``).

Across hosts (``ranks_per_host`` R < N, H = N / R hosts): each row's ``inter_host`` is the
bytes each host sends over its link per optimizer step under shardwise's hierarchical
collectives (within a host over shared memory; across hosts one ring per local rank, carrying
1/R of the data): an all-reduce of X bytes sends 2(H-1)/H·X from each host, a reduce-scatter or
all-gather (H-1)/H·X, so the host-level formulas are the rank-level ones with H for N. FSDP's
hybrid_shard (shard within the host, S = R by default; replicate across hosts) all-reduces its
gradient shards across hosts, 2(H-1)/H·G per host: DDP's inter-host bytes, where ZeRO-3 /
full_shard sends (H-1)/H·(2P·m + G) because every forward and backward gathers across hosts.

Recommendation order (simplest first): a single device when there is one and it fits,
then DDP, ZeRO-2 (start there, not at stage 1), ZeRO-3 / FSDP full_shard only when stage 2 does
not fit, pipeline parallelism when sharding alone does not fit, and CPU offload as last resort.
When the data axis spans hosts, FSDP hybrid_shard comes right after DDP (the default for a
group that spans hosts: sharded memory at DDP's inter-host bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from .gpt_costs import (  # noqa: F401  (the GPT's costs, also used as planner.*)
    _saved_bytes,
    activation_bytes,
    gpt_activation_bytes,
    gpt_gather_bytes,
    gpt_largest_stage_params,
    gpt_tp_communication_bytes,
    gpt_tp_parameters,
)
from .state_bytes import state_bytes_per_param

GIB = 1024**3
ORDER = ("ddp", "zero2", "zero3", "tp_zero3", "pipeline", "zero3_offload")  # simplest first
ORDER_ACROSS_HOSTS = ("ddp", "fsdp_hybrid_shard", *ORDER[1:])
LABELS = {
    "ddp": "ddp",
    "zero1": "zero1",
    "zero2": "zero2",
    "fsdp_shard_grad_op": "fsdp shard_grad_op",
    "zero3": "zero3 / fsdp full_shard",
    "tp_zero3": "tp x zero3, seq. par.",
    "pipeline": "pipeline",
    "zero3_offload": "zero3 + cpu offload",
    "fsdp_hybrid_shard": "fsdp hybrid_shard",
}


@dataclass(frozen=True)
class Row:
    """Bytes per rank of one strategy. ``host`` is what lives in CPU memory instead."""

    strategy: str
    label: str
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    # the engine's buffers: ZeRO-3 / full_shard's transient unsharded units
    # (zero3_gather_bytes), DDP's gradient buckets (a copy of the gradients)
    gathered: int
    total: int
    required: int  # total × overhead
    fits: bool
    host: int = 0
    # ring bytes this rank sends per optimizer step (_data_communication); None: not known
    # (a tp or pipeline row planned from a parameter count, without the model's shapes)
    communication: int | None = 0
    # bytes each host sends over its link per optimizer step (_data_communication over the
    # hosts); None: one host, or a tp / pipeline row whose placement across hosts is not known
    inter_host: int | None = None


@dataclass(frozen=True)
class Recommendation:
    """``strategy`` is a row's name, ``"single"`` (one device, the ddp row) or ``"none"``."""

    strategy: str
    reason: str
    row: Row | None


@dataclass(frozen=True)
class Plan:
    params: int
    world_size: int
    device_memory_bytes: int
    mixed_precision: str
    optimizer: str
    overhead: float
    pipeline_stages: int
    rows: tuple[Row, ...]
    recommendation: Recommendation
    ranks_per_host: int | None = None  # None: every rank on one host
    tp_degree: int = 1  # the tp x zero3 row's tensor-parallel degree (1: no such row)
    micro_batches: int = 1  # per rank and optimizer step (plan's micro_batches)

    @property
    def hosts(self) -> int:
        return self.world_size // (self.ranks_per_host or self.world_size)

    def row(self, strategy: str) -> Row:
        for row in self.rows:
            if row.strategy == strategy:
                return row
        raise KeyError(f"no row '{strategy}'; rows: {', '.join(r.strategy for r in self.rows)}")

    def to_dict(self) -> dict:
        return asdict(self)


def _row(name, p, g, o, act, overhead, memory, host=0, gathered=0, comm: float | None = 0.0):
    p, g, o, act, host = (math.ceil(x) for x in (p, g, o, act, host))  # shards round up
    total = p + g + o + act + gathered
    required = math.ceil(round(total * overhead, 3))
    fits = required <= memory
    row = Row(name, LABELS[name], p, g, o, act, gathered, total, required, fits, host)
    return replace(row, communication=None if comm is None else math.ceil(comm))


def _auto_stages(world_size: int, fits) -> int:
    """The smallest number of pipeline stages (> 1, dividing the world) that fits, else the most."""
    divisors = [p for p in range(2, world_size + 1) if world_size % p == 0]
    for p in divisors:
        if fits(p):
            return p
    return divisors[-1] if divisors else 1


def _auto_tp(world_size: int, fits) -> int:
    """The smallest tensor-parallel degree (a power of two <= 8 dividing the world, so one host
    holds a group) that fits, else the largest."""
    degrees = [t for t in (2, 4, 8) if world_size % t == 0]
    for t in degrees:
        if fits(t):
            return t
    return degrees[-1] if degrees else 1


@dataclass(frozen=True)
class _Inputs:
    """What ``plan`` was given, for ``_rows``."""

    phi: int  # parameters (per tp rank when the model is tensor-parallel)
    n: int  # data-parallel ranks
    memory: int
    precision: str
    optimizer: str
    act: int  # activation bytes of one micro-batch
    stages: int | None
    overhead: float
    gather: int  # zero3_gather_bytes
    stage_params: Callable[[int], int] | None
    micro_batches: int = 1  # per rank and optimizer step
    stage_message: int | None = None  # bytes a stage sends per micro-batch (and gets back)
    tp_communication: Callable[[int], float] | None = None  # tp degree -> bytes per micro-batch
    extra_communication: float = 0.0  # per step, added to every row (a configured tp axis)
    # row -> bytes per element of the parameters it gathers and the gradients it reduces, where
    # they differ from the states' own (plan's communicated_bytes)
    communicated: dict = field(default_factory=dict)
    ranks_per_host: int | None = None  # None: one host
    hybrid_shard_size: int | None = None  # the hybrid row's shard group (default: the host)


def _data_communication(name: str, par: float, grad: float, n: int, m: int) -> float:
    """Ring bytes a rank sends per optimizer step over n data ranks, m micro-batches:
    DDP all-reduces the gradients (2(n-1)/n·G); ZeRO-1/2 and shard_grad_op reduce-scatter them
    and all-gather the updated parameters ((n-1)/n·(G + P)); ZeRO-3 / full_shard gathers the
    parameters in every forward and backward ((n-1)/n·2P·m) and reduce-scatters G once."""
    r = (n - 1) / n
    if name == "ddp":
        return 2 * r * grad
    if name in ("zero1", "zero2", "fsdp_shard_grad_op"):
        return r * (grad + par)
    return r * (2 * par * m + grad)  # zero3, zero3_offload


def optimizer_bytes_per_param(strategy: str, precision: str, optimizer: str) -> int:
    """Bytes of optimizer state a row holds per parameter it updates: the states' (K), and in
    fp32 4 more for ZeRO 1/2, which step a flat fp32 partition, a copy even in fp32 (DeepSpeed's
    as well)."""
    k = state_bytes_per_param(precision, optimizer)[2]
    return k + (4 if precision == "fp32" and strategy in ("zero1", "zero2") else 0)


def _rows(i: _Inputs) -> tuple[list[Row], int, int]:
    bp, bg, bo = state_bytes_per_param(i.precision, i.optimizer)
    phi, n, act, gather, m = i.phi, i.n, i.act, i.gather, i.micro_batches
    par, grad, opt = bp * phi, bg * phi, bo * phi  # P, G, O in the module docstring
    zopt = optimizer_bytes_per_param("zero1", i.precision, i.optimizer) * phi
    args = (i.overhead, i.memory)

    def comm(name: str, sharded_over: int = n, states: float = 1.0, row: str = "") -> float:
        moved_p, moved_g = i.communicated.get(row or name, (bp, bg))
        moved = phi * states
        data = _data_communication(name, moved_p * moved, moved_g * moved, sharded_over, m)
        return data + i.extra_communication

    rows = [
        # torch DDP's buckets (gradient_as_bucket_view=False, as the trainer builds it) hold a
        # flat copy of every gradient for the all-reduce
        _row("ddp", par, grad, opt, act, *args, gathered=grad, comm=comm("ddp")),
        _row("zero1", par, grad, zopt / n, act, *args, comm=comm("zero1")),
        _row("zero2", par, grad / n, zopt / n, act, *args, comm=comm("zero2")),
        _row(
            "fsdp_shard_grad_op",
            par,
            grad / n,
            opt / n,
            act,
            *args,
            comm=comm("zero2", row="fsdp_shard_grad_op"),
        ),  # fmt: skip
        _row("zero3", par / n, grad / n, opt / n, act, *args, gathered=gather, comm=comm("zero3")),
    ]

    def pipeline(p: int) -> Row:
        share = (i.stage_params(p) / phi) if i.stage_params else 1 / p  # the largest stage
        traffic = None
        if i.stage_message is not None:  # + activations forward, their gradients back
            traffic = comm("ddp", n // p, share, row="pipeline") + 2 * i.stage_message * m
        return _row("pipeline", par * share, grad * share, opt * share, act, *args, comm=traffic)

    def tensor_parallel(t: int) -> Row:
        # tp x zero3: model states sharded over all n ranks (t ways by tp, n / t by zero3);
        # with sequence parallelism every activation is split t ways (Korthikanti et al.)
        traffic = None
        if i.tp_communication is not None:
            traffic = comm("zero3", n // t, 1 / t, row="tp_zero3") + i.tp_communication(t) * m
        return _row(
            "tp_zero3",
            par / n,
            grad / n,
            opt / n,
            act / t,
            *args,
            gathered=gather / t,
            comm=traffic,
        )

    tp = _auto_tp(n, lambda t: tensor_parallel(t).fits)
    if tp > 1:
        rows.append(tensor_parallel(tp))
    stages = i.stages
    if stages is None:
        stages = _auto_stages(n, lambda p: pipeline(p).fits)
    if stages > 1:
        rows.append(pipeline(stages))
    offload = _row("zero3_offload", par / n, grad / n, 0, act, *args, host=opt / n, gathered=gather)
    rows.append(replace(offload, communication=math.ceil(comm("zero3"))))
    return _across_hosts(i, rows), stages, tp


# the rank-level formula of _data_communication each row's collectives follow
_FORMULA = {"fsdp_shard_grad_op": "zero2", "zero3_offload": "zero3", "fsdp_hybrid_shard": "ddp"}


def _across_hosts(i: _Inputs, rows: list[Row]) -> list[Row]:
    """``rows`` with FSDP's hybrid_shard row (S = hybrid_shard_size, default the host's ranks,
    when 1 < S < N) after zero3, and every data-parallel row's ``inter_host`` bytes when the
    ranks span hosts (module docstring, "Across hosts")."""
    bp, bg, bo = state_bytes_per_param(i.precision, i.optimizer)
    n, m, per_host = i.n, i.micro_batches, i.ranks_per_host or i.n
    shards, hosts = i.hybrid_shard_size or per_host, n // per_host

    def moved(name: str) -> tuple[float, float]:
        p, g = i.communicated.get(name, (bp, bg))
        return p * i.phi, g * i.phi

    if 1 < shards < n:
        par, grad = moved("fsdp_hybrid_shard")
        replicas = n // shards
        traffic = _data_communication("zero3", par, grad, shards, m)  # within the shard group
        traffic += 2 * (replicas - 1) / replicas * grad / shards  # its shard, across replicas
        hybrid = _row(
            "fsdp_hybrid_shard",
            bp * i.phi / shards,
            bg * i.phi / shards,
            bo * i.phi / shards,
            i.act,
            i.overhead,
            i.memory,
            gathered=i.gather,
            comm=traffic + i.extra_communication,
        )
        at = next(k for k, r in enumerate(rows) if r.strategy == "zero3") + 1
        rows = [*rows[:at], hybrid, *rows[at:]]
    if hosts == 1:
        return rows

    def inter_host(row: Row) -> int | None:
        if row.strategy in ("tp_zero3", "pipeline"):
            return None
        if row.strategy == "fsdp_hybrid_shard" and shards != per_host:
            return None  # replicas within a host too: not one ring per local rank
        formula = _FORMULA.get(row.strategy, row.strategy)
        return math.ceil(_data_communication(formula, *moved(row.strategy), hosts, m))

    return [replace(row, inter_host=inter_host(row)) for row in rows]


def _recommend(
    rows: list[Row], world_size: int, memory: int, stages: int, per_host: int, tp: int
) -> Recommendation:
    by_name = {r.strategy: r for r in rows}
    gib = f"{memory / GIB:.1f} GiB"
    hosts = world_size // per_host
    reasons = {
        "ddp": "model states and activations fit each device whole; plain DDP is simplest",
        "zero2": "DDP does not fit; ZeRO-2 (or FSDP shard_grad_op) shards grads + optimizer state",
        "zero3": "ZeRO-2 does not fit; ZeRO-3 / FSDP full_shard also shards the parameters",
        "tp_zero3": "ZeRO-3 does not fit (activations); tensor + sequence parallelism also "
        "splits every activation",
        "pipeline": "no data-parallel sharding fits; pipeline stages split the layers",
        "zero3_offload": "nothing fits on the device alone; offload optimizer state to CPU "
        "(last resort, slow)",
    }
    hybrid = by_name.get("fsdp_hybrid_shard")
    if hybrid is not None and hybrid.inter_host is not None:  # set only across hosts
        reasons["fsdp_hybrid_shard"] = (
            f"DDP does not fit; the data axis spans {hosts} hosts of {per_host} ranks: FSDP "
            "hybrid_shard shards within each host and replicates across hosts, sending "
            f"{hybrid.inter_host / 2**20:.1f} MiB per host link per step in one all-reduce "
            "per unit (DDP's bytes) where zero3 / full_shard sends "
            f"{by_name['zero3'].inter_host / 2**20:.1f} MiB and gathers across hosts in every "
            "forward and backward"
        )
    for name in ORDER_ACROSS_HOSTS if "fsdp_hybrid_shard" in reasons else ORDER:
        row = by_name.get(name)
        if row is None or not row.fits:
            continue
        if name == "ddp" and world_size == 1:
            return Recommendation("single", f"fits one device ({gib}); no parallelism needed", row)
        if name == "pipeline":
            reason = reasons[name] + f" ({stages} stages x {world_size // stages} data-parallel)"
        elif name == "tp_zero3":
            reason = reasons[name] + f" (tp {tp} x zero3 over {world_size // tp})"
        else:
            reason = reasons[name]
        return Recommendation(name, f"{reason}; needs {row.required / GIB:.1f} of {gib}", row)
    smallest = min(rows, key=lambda r: r.total)
    return Recommendation(
        "none",
        f"does not fit: the smallest is {smallest.label} at {smallest.required / GIB:.1f} GiB "
        f"per rank (with overhead) against {gib}; add GPUs, shrink the micro-batch or enable "
        "activation checkpointing",
        None,
    )


def plan(
    params: int,
    world_size: int,
    device_memory_bytes: int,
    *,
    mixed_precision: str = "bf16",
    optimizer: str = "adamw",
    activation_bytes_per_rank: int = 0,
    pipeline_stages: int | None = None,
    overhead: float = 1.1,
    zero3_gather_bytes: int = 0,
    largest_stage_params=None,
    micro_batches: int = 1,
    stage_message_bytes: int | None = None,
    tp_communication_bytes=None,
    extra_communication_bytes: float = 0.0,
    communicated_bytes: dict[str, tuple[int, int]] | None = None,
    ranks_per_host: int | None = None,
    hybrid_shard_size: int | None = None,
) -> Plan:
    """Per-rank bytes of every strategy for ``params`` parameters on ``world_size`` devices of
    ``device_memory_bytes`` each, and the simplest one that fits.

    ``pipeline_stages``: None picks the fewest stages (dividing ``world_size``) that fit; 1
    leaves the pipeline row out; otherwise it must divide ``world_size``.
    ``zero3_gather_bytes``: transient bytes of the unsharded units ZeRO-3 / FSDP full_shard
    gathers (``gpt_gather_bytes`` for the bundled GPT), added to the zero3 and offload rows.
    ``largest_stage_params(p)``: parameters of the largest of p pipeline stages (for the bundled
    GPT ``gpt_largest_stage_params``: whole blocks and the tied head's copy); default Φ / p.
    Communication per rank and optimizer step (``Row.communication``, ring traffic): over the
    data axis from the state sizes (``_data_communication``) for ``micro_batches`` micro-batches
    per step; the pipeline row adds ``stage_message_bytes`` (one micro-batch's stage output)
    sent forward and received back per micro-batch (None: unknown); the tp row adds
    ``tp_communication_bytes(t)`` per micro-batch (``gpt_tp_communication_bytes``; None:
    unknown); and
    ``extra_communication_bytes`` (a configured tp axis's traffic per step) goes to every row.
    ``communicated_bytes``: row name -> (bytes per parameter element gathered, per gradient
    element reduced) where a row moves other dtypes than the states it holds
    (``communicated_bytes_for_config``); default: the parameters' and gradients' own.
    ``ranks_per_host``: the ranks on each host (torchrun's ``--nproc-per-node``; None: all on
    one); below ``world_size`` it gives every data-parallel row its ``inter_host`` bytes and
    puts FSDP hybrid_shard right after DDP in the recommendation order. ``hybrid_shard_size``:
    the hybrid_shard row's shard group (a configured mesh's shards; default the host's ranks).
    """
    _check(params=params, world_size=world_size, device_memory_bytes=device_memory_bytes)
    for name, value in (
        ("activation_bytes_per_rank", activation_bytes_per_rank),
        ("zero3_gather_bytes", zero3_gather_bytes),
    ):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if overhead < 1.0:
        raise ValueError(f"overhead must be >= 1.0 (a multiplier), got {overhead}")
    for name, value in (
        ("ranks_per_host", ranks_per_host),
        ("hybrid_shard_size", hybrid_shard_size),
    ):
        if value is not None and (value < 1 or world_size % value):
            raise ValueError(f"{name}={value} must be >= 1 and divide world_size={world_size}")
    if pipeline_stages is not None and (pipeline_stages < 1 or world_size % pipeline_stages != 0):
        raise ValueError(
            f"pipeline_stages={pipeline_stages} must be >= 1 and divide world_size={world_size}"
        )
    rows, stages, tp = _rows(
        _Inputs(
            params,
            world_size,
            device_memory_bytes,
            mixed_precision,
            optimizer,
            activation_bytes_per_rank,
            pipeline_stages,
            overhead,
            zero3_gather_bytes,
            largest_stage_params,
            micro_batches,
            stage_message_bytes,
            tp_communication_bytes,
            extra_communication_bytes,
            dict(communicated_bytes or {}),
            ranks_per_host,
            hybrid_shard_size,
        )
    )
    return Plan(
        params,
        world_size,
        device_memory_bytes,
        mixed_precision,
        optimizer,
        overhead,
        stages,
        tuple(rows),
        _recommend(rows, world_size, device_memory_bytes, stages, ranks_per_host or world_size, tp),
        ranks_per_host,
        tp,
        micro_batches,
    )


def _check(**positive) -> None:
    for name, value in positive.items():
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
