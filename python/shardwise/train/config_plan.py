"""A shardwise-train config's plan: ``plan_for_config`` hands the planner (``planner.plan``)
the config's model shapes, precision, micro-batches, layout and communicated dtypes, and
``row_for_config`` names the planner's row the config's strategy runs. ``shardwise-train``'s
memory check, its step-time prediction and ``shardwise-plan --config`` all ask these two, so
they cannot disagree."""

from __future__ import annotations

from .gpt_costs import (
    gpt_activation_bytes,
    gpt_gather_bytes,
    gpt_largest_stage_params,
    gpt_tp_communication_bytes,
    gpt_tp_parameters,
)
from .planner import Plan, plan


def plan_for_config(cfg, memory: int, optimizer: str = "adamw", overhead: float = 1.1) -> Plan:
    """The plan of a validated shardwise-train config (``config.TrainConfig``): its GPT,
    precision, micro-batch and stages; with a tp axis, the rows are the strategies over the data
    axis of the tensor-parallel model: its parameters, activations (measured on one tp rank)
    and gathered units per tp rank, and its tp traffic added to every row's communication.
    ``shardwise-train``'s memory check and ``shardwise-plan --config`` both call this, so they
    cannot disagree."""
    gpt, world, d = cfg.gpt_config(), cfg.distributed.world_size, cfg.distributed
    tp, sp, t = d.tensor_parallel_size, d.sequence_parallel, cfg.training
    params = gpt.num_parameters()
    if tp > 1:
        params = gpt_tp_parameters(gpt, tp, sp)
        world //= tp
    precision = {"no": "fp32"}.get(cfg.mixed_precision, cfg.mixed_precision)
    stages = d.pipeline_parallel_size
    # every layout runs the same micro-batches of micro_batch_size sequences per step
    micro_batches = t.gradient_accumulation_steps
    if d.strategy == "pipeline" and d.pipeline is not None:
        micro_batches *= d.pipeline.num_microbatches or stages
    block_bytes = 4 if precision == "fp32" else 2
    # the data axis's ranks per host (tp groups within a host) and a hybrid mesh's shard group
    per_host = d.num_processes_per_node // tp if d.num_processes_per_node % tp == 0 else None
    layout = cfg.layout()
    hybrid = layout.axis_size("fsdp") if layout.axis_size("dp") > 1 else None

    def tp_bytes(degree: int, sequence_parallel: bool = True, saved: bool = False) -> float:
        counts = gpt_tp_communication_bytes(
            gpt, t.micro_batch_size, sequence_parallel, block_bytes, degree
        )
        return counts["total"] + (0 if saved else counts["regather"])

    return plan(
        params,
        world,
        memory,
        mixed_precision=precision,
        optimizer=optimizer,
        activation_bytes_per_rank=gpt_activation_bytes(
            gpt,
            t.micro_batch_size,
            precision,
            cfg.activation_checkpointing,
            tp,
            sp,
            d.sequence_parallel_save_gathered,
            low_params=low_precision_parameters(cfg),
        ),
        pipeline_stages=stages if stages > 1 else None,
        overhead=overhead,
        zero3_gather_bytes=gpt_gather_bytes(gpt, precision, tp),
        largest_stage_params=lambda p: gpt_largest_stage_params(gpt, p) // tp,
        micro_batches=micro_batches,
        stage_message_bytes=t.micro_batch_size * gpt.seq_len * gpt.dim * 4,
        tp_communication_bytes=tp_bytes if tp == 1 else None,
        extra_communication_bytes=(
            tp_bytes(tp, sp, d.sequence_parallel_save_gathered) * micro_batches if tp > 1 else 0.0
        ),
        communicated_bytes=communicated_bytes_for_config(cfg),
        ranks_per_host=per_host if per_host and world % per_host == 0 else None,
        hybrid_shard_size=hybrid if hybrid and hybrid < world else None,
    )


# the rows whose collectives reduce gradients over the data axis
REDUCING_ROWS = (
    "ddp", "zero1", "zero2", "zero3", "zero3_offload", "tp_zero3", "fsdp_shard_grad_op",
    "fsdp_hybrid_shard", "pipeline",
)  # fmt: skip


def communicated_bytes_for_config(cfg) -> dict[str, tuple[int, int]]:
    """What the data-parallel rows of a shardwise-train config move per element (gathered,
    reduced), where it is not the states' dtype (``plan``'s communicated_bytes). Under bf16 /
    fp16, DDP and the pipeline's replicas hold fp32 parameters under autocast, so they reduce
    fp32 gradients (DDP in ``distributed.ddp_comm_hook``'s dtype when one is set); FSDP gathers
    in its param_dtype and reduces in fsdp_reduce_dtype, as the config's FSDP keys resolve them
    (the fsdp_shard_grad_op and fsdp_hybrid_shard rows, and the zero3 and tp_zero3 rows when the
    strategy is fsdp); ZeRO gathers its 16-bit parameters and reduces 16-bit gradients at stages
    1 and 2 (float32 in deterministic mode, as ``ZeroOptimizer`` reduces), float32 ones at
    stage 3 (its FSDP units' reduce dtype, ``zero.engine``). The shardwise backend's own (host)
    collectives add 16-bit floats in float32 and carry them so (``collectives::allreduce``
    widens them first), so on the CPU every reduction moves at least 4 bytes per element; NCCL
    and gloo move the dtype they are given. In fp32 all move fp32."""
    from ..fsdp.config import FSDPConfig, dtype_of
    from .device import backend_parts
    from .parallelize import fsdp_keys

    if cfg.mixed_precision == "no":
        return {}
    d = cfg.distributed
    hooked = d.ddp_comm_hook != "no"
    keys = fsdp_keys(d.fsdp or {}, cfg.mixed_precision)
    fsdp = (4, 4)
    if keys["fsdp_mixed_precision"]:
        fsdp = tuple(
            dtype_of(k, keys.get(k, getattr(FSDPConfig, k))).itemsize
            for k in ("fsdp_param_dtype", "fsdp_reduce_dtype")
        )
    zero_reduce = 4 if cfg.training.deterministic else 2
    out = {name: (2, zero_reduce) for name in REDUCING_ROWS}
    out.update(zero3=(2, 4), zero3_offload=(2, 4), tp_zero3=(2, 4))
    out.update(ddp=(4, 2 if hooked else 4), pipeline=(4, 4), fsdp_shard_grad_op=fsdp)
    out["fsdp_hybrid_shard"] = fsdp
    if d.strategy == "fsdp":
        out.update(zero3=fsdp, tp_zero3=fsdp, zero3_offload=fsdp)
    parts = backend_parts(d.backend)
    if cfg.training.device == "cpu" and parts.get("cpu", parts.get("*")) == "shardwise":
        out = {name: (gathered, max(reduced, 4)) for name, (gathered, reduced) in out.items()}
    return out


def low_precision_parameters(cfg) -> bool:
    """Whether the config's engine computes with bf16 / fp16 parameters and no autocast
    (``parallelize.casts_parameters``: ZeRO, FSDP's own mixed precision); a pipeline's stages
    run under autocast."""
    from .parallelize import casts_parameters

    d = cfg.distributed
    if d.strategy == "pipeline" or d.pipeline_parallel_size > 1:
        return False
    return casts_parameters(d.strategy, d.fsdp or {}, cfg.mixed_precision)


def row_for_config(cfg) -> str:
    """The planner row a config's strategy runs: the pipeline's (one stage holds the whole
    model when there is one stage, as DDP does), ZeRO's stage, FSDP's sharding strategy
    (hybrid_shard on one host's ranks is full_shard: ``Plan.row`` has no hybrid row then, and
    the caller falls back to zero3), else DDP."""
    strategy = cfg.distributed.strategy
    if strategy == "pipeline":
        return "pipeline" if cfg.distributed.pipeline_parallel_size > 1 else "ddp"
    if strategy == "zero":
        stage = cfg.zero_config()["zero_optimization"]["stage"]
        return {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]
    if strategy == "fsdp":
        sharding = cfg.fsdp_config().fsdp_sharding_strategy
        rows = {"shard_grad_op": "fsdp_shard_grad_op", "no_shard": "ddp"}
        rows["hybrid_shard"] = "fsdp_hybrid_shard"
        return rows.get(sharding, "zero3")
    return "ddp"


def config_row(cfg, result: Plan):
    """The ``Row`` of ``result`` the config runs (``row_for_config``; zero3 where its row is
    absent)."""
    name = row_for_config(cfg)
    return result.row(name if name in {r.strategy for r in result.rows} else "zero3")
