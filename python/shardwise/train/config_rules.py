"""The cross-field rules of a ``shardwise-train`` config, run by ``config.validate`` after the
section models are built: values left out resolved in place (the precision, the layout and
world from torchrun's variables, the device, the strategy), then every rule that spans keys (the
tensor-parallel, ZeRO, FSDP, hybrid mesh, pipeline and training rules), each error naming the key
and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .. import _C
from ..zero.config import TOP_KEYS as ZERO_TOP_KEYS
from . import device as device_mod
from .config_schema import (
    FLAT_FSDP_KEYS,
    FSDP_KEYS,
    PRECISIONS,
    PipelineSection,
    TrainConfig,
    _check_keys,
    _given_meshes,
)


def _lift_flat_fsdp_keys(data: Mapping) -> tuple[dict, list[str]]:
    """FSDP configs often write their keys directly under ``distributed:``; move them into
    ``fsdp:``."""
    data = dict(data)
    dist = data.get("distributed")
    if not isinstance(dist, Mapping) or not any(k in dist for k in FLAT_FSDP_KEYS):
        return data, []
    dist = dict(dist)
    block = dict(dist.get("fsdp") or {})
    lifted = [key for key in FLAT_FSDP_KEYS if key in dist]
    for key in lifted:
        value = dist.pop(key)
        if key in block and block[key] != value:
            raise ValueError(
                f"distributed.{key}={value!r} conflicts with distributed.fsdp.{key}="
                f"{block[key]!r}; set it in one place"
            )
        block[key] = value
    dist["fsdp"] = block
    data["distributed"] = dist
    return data, lifted


def _resolve_precision(cfg: TrainConfig) -> None:
    t, d = cfg.training, cfg.distributed
    given = {}
    if t.bf16 is not None:
        given["training.bf16"] = "bf16" if t.bf16 else "no"
    if t.mixed_precision is not None:
        given["training.mixed_precision"] = t.mixed_precision
    if d.mixed_precision is not None:
        given["distributed.mixed_precision"] = d.mixed_precision
    if len(set(given.values())) > 1:
        listed = ", ".join(f"{k} -> {v}" for k, v in given.items())
        raise ValueError(
            f"mixed precision is set inconsistently ({listed}); set only "
            f"training.mixed_precision (one of {', '.join(PRECISIONS)})"
        )
    t.mixed_precision = next(iter(given.values()), "no")


def _from_env(key: str, given: int | None, env: Mapping, var: str) -> int | None:
    """The explicit value, else torchrun's variable; both given must agree."""
    raw = env.get(var)
    if raw is None or raw == "":
        return given
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {var}={raw!r} is not an integer") from None
    if given is not None and given != value:
        raise ValueError(
            f"{key}={given} but the launcher set {var}={value}; remove {key} "
            f"from the config or launch with a matching {var}"
        )
    return value


def _resolve_layout(cfg: TrainConfig, env: Mapping) -> None:
    """The distributed config's rules: world_size == num_nodes × num_processes_per_node, tensor
    × pipeline parallel <= world_size, rank < world_size; plus the mesh's product == world_size."""
    d = cfg.distributed
    launch = ("world_size", "rank", "master_addr", "master_port")
    d._launch_given = {k for k in launch if getattr(d, k) is not None}
    meshes = _given_meshes(cfg)
    world = _from_env("distributed.world_size", d.world_size, env, "WORLD_SIZE")
    if world is None:
        world = (d.num_nodes or 1) * (d.num_processes_per_node or 1)
    d.world_size = world
    if d.num_processes_per_node is None and env.get("LOCAL_WORLD_SIZE"):
        d.num_processes_per_node = int(env["LOCAL_WORLD_SIZE"])
    if d.num_processes_per_node is None:
        d.num_processes_per_node = max(1, world // (d.num_nodes or 1))
    if d.num_nodes is None:
        d.num_nodes = max(1, world // d.num_processes_per_node)
    if world != d.num_nodes * d.num_processes_per_node:
        raise ValueError(
            f"rule world_size == num_nodes * num_processes_per_node violated: "
            f"distributed.world_size={world} but distributed.num_nodes={d.num_nodes} × "
            f"distributed.num_processes_per_node={d.num_processes_per_node} = "
            f"{d.num_nodes * d.num_processes_per_node}; fix one of the three"
        )
    d.rank = _from_env("distributed.rank", d.rank, env, "RANK") or 0
    d.local_rank = _from_env("distributed.local_rank", d.local_rank, env, "LOCAL_RANK") or 0
    if d.rank >= world:
        raise ValueError(
            f"rule rank < world_size violated: distributed.rank={d.rank} with "
            f"world_size={world}; ranks run 0..{world - 1}"
        )
    if d.local_rank >= d.num_processes_per_node:
        raise ValueError(
            f"distributed.local_rank={d.local_rank} must be < "
            f"num_processes_per_node={d.num_processes_per_node}"
        )
    d.master_addr = d.master_addr or env.get("MASTER_ADDR") or None
    if d.master_port is None and env.get("MASTER_PORT"):
        d.master_port = int(env["MASTER_PORT"])
    # every mesh rule, once (csrc/mesh/parallel_layout.h); the sizes are read from it after
    layout = _C.ParallelLayout(
        world, meshes, d.tensor_parallel_size or 0, d.pipeline_parallel_size or 0
    )
    cfg._layout = layout
    d.tensor_parallel_size = layout.tensor_parallel_size
    d.pipeline_parallel_size = layout.pipeline_parallel_size
    if d.enabled is False and world > 1:
        raise ValueError(
            f"distributed.enabled=false but world_size={world}; set "
            f"distributed.enabled=true or launch one process"
        )
    d.enabled = world > 1 if d.enabled is None else d.enabled


def _resolve_device(cfg: TrainConfig, cuda_devices: int | None) -> None:
    """training.device and distributed.backend against the machine (``device.py``'s rules)."""
    import torch

    count = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    t, d = cfg.training, cfg.distributed
    t.device = device_mod.resolve_device(t.device, count)
    d.backend = d.backend or device_mod.default_backend(t.device, count, d.num_processes_per_node)
    device_mod.check_backend(d.backend, t.device, count, d.num_processes_per_node)


def _resolve_strategy(cfg: TrainConfig) -> None:
    """The explicit strategy, else: a pp axis > 1 -> pipeline; an fsdp block (or the FSDP key
    use_fsdp) -> fsdp; a zero block -> zero; an fsdp mesh axis > 1 -> fsdp; else ddp."""
    d = cfg.distributed
    use_fsdp = (d.fsdp or {}).get("use_fsdp", d.fsdp is not None)
    fsdp_axis = cfg.layout().axis_size("fsdp")
    if d.strategy is None:
        if d.pipeline_parallel_size > 1:
            d.strategy = "pipeline"
        elif use_fsdp:
            d.strategy = "fsdp"
        elif d.zero is not None:
            d.strategy = "zero"
        else:
            d.strategy = "fsdp" if fsdp_axis > 1 else "ddp"
    if d.pipeline_parallel_size > 1 and d.strategy != "pipeline":
        raise ValueError(
            f"distributed.strategy={d.strategy} but pipeline_parallel_size="
            f"{d.pipeline_parallel_size}; set distributed.strategy=pipeline or the pp axis to 1"
        )
    if use_fsdp and d.strategy not in ("fsdp", "pipeline"):
        raise ValueError(
            f"distributed.use_fsdp/fsdp is set but distributed.strategy="
            f"{d.strategy}; drop the fsdp keys or set distributed.strategy=fsdp"
        )
    if d.zero is not None and d.strategy != "zero":
        raise ValueError(
            f"distributed.zero is set but distributed.strategy={d.strategy}; "
            f"drop distributed.zero or set distributed.strategy=zero"
        )
    if d.pipeline is not None and d.strategy != "pipeline":
        raise ValueError(
            f"distributed.pipeline is set but distributed.strategy={d.strategy}; "
            f"drop it or set distributed.strategy=pipeline"
        )
    if d.strategy == "pipeline" and d.pipeline is None:
        d.pipeline = PipelineSection()


def _check_tensor_parallel(cfg: TrainConfig) -> None:
    """tp > 1: the data axis's name and size for the strategy over it (ddp, fsdp, zero, or the
    pipeline's stages), and every dimension the tp size must divide, before any process
    starts."""
    d = cfg.distributed
    tp = d.tensor_parallel_size
    key = cfg.layout().mesh_key or "distributed.tensor_parallel_size"
    if d.sequence_parallel_save_gathered and not d.sequence_parallel:
        raise ValueError(
            "distributed.sequence_parallel_save_gathered=true needs "
            "distributed.sequence_parallel=true; set it or drop sequence_parallel_save_gathered"
        )
    if tp == 1:
        if d.sequence_parallel:
            raise ValueError(
                "distributed.sequence_parallel=true needs tensor parallelism (a tp axis > 1); "
                "set distributed.tensor_parallel_size or drop sequence_parallel"
            )
        return
    layout = cfg.layout()
    if d.strategy == "pipeline":
        p = d.pipeline
        if p.schedule == "zb_h1":
            raise ValueError(
                "distributed.pipeline: with tensor parallelism use a schedule other than zb_h1 "
                "(its deferred weight gradients are plain nn.Linear's, not tp layers')"
            )
    data = layout.data_parallel_size
    if d.strategy == "fsdp":
        if layout.axis_size("dp") > 1:
            raise ValueError(
                f"{key}: the data axis is named 'dp' but distributed.strategy=fsdp; name it "
                f"'fsdp' (e.g. [[{data}, {tp}], ['fsdp', 'tp']]) or use strategy ddp"
            )
        sharding = cfg.fsdp_config().fsdp_sharding_strategy
        if sharding not in ("full_shard", "shard_grad_op"):
            raise ValueError(
                f"distributed.fsdp.fsdp_sharding_strategy={sharding} with tensor parallelism is "
                "not supported yet; use full_shard or shard_grad_op"
            )
    elif layout.axis_size("fsdp") > 1 and d.strategy != "pipeline":  # pipeline stages may shard
        raise ValueError(
            f"{key}: the data axis is named 'fsdp' but distributed.strategy={d.strategy}; name "
            f"it 'dp' or use strategy fsdp"
        )
    if d.strategy == "zero" and data == 1:
        raise ValueError(
            f"{key}: ZeRO over a data axis of size 1 partitions nothing; use strategy ddp with "
            f"tp={tp}, or launch more processes for a dp axis > 1"
        )
    if cfg.model._builder is not None:
        return  # model_source.check_strategy checked the model's own sizes
    gpt = cfg.gpt_config()
    seq = cfg.data.seq_len or gpt.seq_len
    dims = [
        ("model.heads", gpt.heads),
        ("model.vocab_size", gpt.vocab_size),
        ("model.dim", gpt.dim),
        ("model.dim × model.mlp_ratio", gpt.dim * gpt.mlp_ratio),
    ]
    if d.sequence_parallel:
        dims.append(("data.seq_len (sequence parallelism)", seq))
    for name, value in dims:
        if value % tp:
            raise ValueError(
                f"{key}: {name} = {value} is not divisible by the tensor-parallel size {tp}; "
                f"choose a tp size that divides {value} or change {name.split(' ')[0]}"
            )


def _check_zero_against_training(cfg: TrainConfig) -> None:
    """Values the trainer drives itself (the lr each step, unless the DeepSpeed config has a
    scheduler; the clipping) must not differ between the two sections: one would be ignored."""
    zero, t = cfg.distributed.zero, cfg.training
    optimizer = zero.get("optimizer")
    params = optimizer.get("params", {}) if isinstance(optimizer, dict) else {}
    lr = params.get("lr") if isinstance(params, dict) else None
    if lr not in (None, "auto") and "scheduler" not in zero and lr != cfg.scaled_learning_rate:
        raise ValueError(
            f"distributed.zero.optimizer.params.lr={lr!r} differs from the trainer's learning "
            f"rate {cfg.scaled_learning_rate!r} (training.learning_rate, scaled), which sets the "
            'lr every step; set it once (training.learning_rate, or "auto"), or give the '
            "DeepSpeed config a scheduler"
        )
    clip = zero.get("gradient_clipping")
    if clip not in (None, "auto") and float(clip) != float(t.gradient_clip_norm or 0.0):
        raise ValueError(
            f"distributed.zero.gradient_clipping={clip!r} differs from "
            f"training.gradient_clip_norm={t.gradient_clip_norm!r}; set it once"
        )


def _delegate(path: str, check) -> Any:
    """Runs another module's validator; its ValueError gets the dotted path in front."""
    try:
        return check()
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None


def _check_sub_blocks(cfg: TrainConfig, lifted: Sequence[str]) -> None:
    d, t = cfg.distributed, cfg.training
    _check_hybrid_mesh(cfg)
    _check_lamb(cfg)
    if d.fsdp is not None:
        _check_keys("distributed.fsdp", d.fsdp, FSDP_KEYS)
        try:
            cfg.fsdp_config()
        except ValueError as error:  # FSDPConfig's messages start with the key they are about
            key = str(error).replace(":", " ").split(" ", 1)[0]
            where = "distributed" if key in lifted else "distributed.fsdp"
            text = f"{where}.{error}" if key in FSDP_KEYS else f"{where}: {error}"
            raise ValueError(text) from None
    if d.zero is not None:
        _check_keys("distributed.zero", d.zero, sorted(ZERO_TOP_KEYS))
        for key, ours in (
            ("train_micro_batch_size_per_gpu", "micro_batch_size"),
            ("gradient_accumulation_steps", "gradient_accumulation_steps"),
        ):
            if key in d.zero and d.zero[key] not in ("auto", getattr(t, ours)):
                raise ValueError(
                    f"distributed.zero.{key}={d.zero[key]!r} differs from training.{ours}="
                    f"{getattr(t, ours)!r}; set it once, under training.{ours}"
                )
        _delegate("distributed.zero", cfg.zero_config)  # types first: the check below compares
        _check_zero_against_training(cfg)
    if d.strategy == "pipeline":
        _check_pipeline(cfg)


def _check_hybrid_mesh(cfg: TrainConfig) -> None:
    """A mesh with both dp and fsdp axes > 1 is hybrid sharding: it runs as FSDP's hybrid_shard
    over that mesh (the mesh handed to FSDP), or is refused with the fix; never silently as
    full sharding over the whole world."""
    d, layout = cfg.distributed, cfg.layout()
    replicas, shards = layout.axis_size("dp"), layout.axis_size("fsdp")
    if replicas == 1 or shards == 1 or d.strategy == "pipeline":
        return
    mesh = cfg.mesh()
    sharding = (d.fsdp or {}).get("fsdp_sharding_strategy")
    if d.strategy != "fsdp" or sharding != "hybrid_shard":
        raise ValueError(
            f"mesh {mesh} has dp and fsdp axes: that is hybrid sharding (replicate across dp, "
            f"shard within fsdp); set distributed.strategy=fsdp and "
            f"distributed.fsdp.fsdp_sharding_strategy=hybrid_shard, or use one data axis"
        )
    d.fsdp = {**d.fsdp, "mesh_shape": [[replicas, shards], ["dp", "fsdp"]]}


def _check_lamb(cfg: TrainConfig) -> None:
    """LAMB's trust ratio adds each parameter's pieces over the shard group: under hybrid
    sharding the replicas would count each piece again; ZeRO with a tp axis has no split-norm
    reduction yet."""
    d = cfg.distributed
    if cfg.training.optimizer != "lamb":
        return
    sharding = (d.fsdp or {}).get("fsdp_sharding_strategy", "")
    if d.strategy in ("fsdp", "pipeline") and "hybrid" in str(sharding):
        raise ValueError(
            f"training.optimizer=lamb with distributed.fsdp.fsdp_sharding_strategy={sharding} "
            "is not supported (the trust ratio's norms over sharded replicas); use full_shard, "
            "or training.optimizer=adamw"
        )
    if d.strategy == "zero" and cfg.layout().axis_size("tp") > 1:
        raise ValueError(
            "training.optimizer=lamb with strategy zero and a tp axis is not supported; use "
            "strategy fsdp with the tp axis, or training.optimizer=adamw"
        )


def _check_pipeline(cfg: TrainConfig) -> None:
    from .. import pipeline as pp  # the C++ schedule builder; pure, no process group

    p, stages = cfg.distributed.pipeline, cfg.distributed.pipeline_parallel_size
    if p.num_microbatches is None:
        p.num_microbatches = stages
    if p.schedule == "zb_h1" and cfg.layout().axis_size("fsdp") > 1:
        raise ValueError(
            "distributed.pipeline.schedule=zb_h1 with an fsdp x pp mesh: FSDP reduces gradients "
            "during the backward, which ZB-H1 splits; use schedule 1f1b, or a dp x pp mesh"
        )
    _delegate(
        "distributed.pipeline",
        lambda: pp.make_schedule(p.schedule, stages, p.num_microbatches, p.virtual_stages),
    )


def _check_sync_every(cfg: TrainConfig) -> None:
    t, strategy = cfg.training, cfg.distributed.strategy
    every = t.sync_gradients_every
    if every is None:
        return
    if t.gradient_accumulation_steps % every:
        raise ValueError(
            f"training.sync_gradients_every={every} must divide "
            f"training.gradient_accumulation_steps={t.gradient_accumulation_steps}"
        )
    if strategy in ("zero", "pipeline") and every != t.gradient_accumulation_steps:
        how = (
            "ZeRO reduces every micro-batch into its partition, as DeepSpeed does"
            if strategy == "zero"
            else "the pipeline reduces once per step, after its schedule"
        )
        raise ValueError(
            f"training.sync_gradients_every applies to ddp and fsdp: {how}; leave it out"
        )


def _check_deterministic(cfg: TrainConfig) -> None:
    """training.deterministic: a data-parallel size the tree divides, and the strategies and
    precisions whose reductions follow the tree."""
    t, d = cfg.training, cfg.distributed
    if not t.deterministic:
        return
    size = cfg.data_parallel_size
    if size & (size - 1):
        raise ValueError(
            f"training.deterministic=true needs a power-of-two data-parallel size (the "
            f"gradients' summation tree), got {size}; run on 1, 2, 4 or 8 data ranks"
        )
    if d.strategy == "pipeline":
        _check_deterministic_pipeline(cfg)
    if d.strategy in ("fsdp", "zero") and t.optimizer == "lamb":
        raise ValueError(
            f"training.deterministic=true with strategy {d.strategy} and training.optimizer="
            "lamb: LAMB's trust-ratio norms add the shards' partial sums; use adamw, or ddp"
        )
    if cfg.mixed_precision == "fp16":
        raise ValueError(
            "training.deterministic=true covers fp32 and bf16 (fp16's loss scale is outside "
            "the contract); set training.mixed_precision to no or bf16"
        )
    for key, value in (("training.sync_gradients_every", t.sync_gradients_every),
                       ("distributed.ddp_comm_hook", None if d.ddp_comm_hook == "no"
                        else d.ddp_comm_hook)):  # fmt: skip
        if value is not None:
            raise ValueError(
                f"{key}={value} with training.deterministic=true: the deterministic mode "
                f"reduces every micro-batch in float32 through its tree; leave {key} out"
            )


def _check_deterministic_pipeline(cfg: TrainConfig) -> None:
    """The pipeline's deterministic mode (C++ ``PipelineOptions::deterministic``): replicated
    stages, whole backwards in microbatch order, a tree-shaped global batch."""
    p = cfg.distributed.pipeline
    if cfg.layout().axis_size("fsdp") > 1:
        raise ValueError(
            "training.deterministic=true with FSDP-sharded pipeline stages: the mode covers "
            "replicated stages; use a dp axis instead of the fsdp axis"
        )
    if p.schedule == "zb_h1":
        raise ValueError(
            "distributed.pipeline.schedule=zb_h1 with training.deterministic=true: its split "
            "backwards leave no point where a microbatch's gradients are whole; use 1f1b, "
            "gpipe or interleaved_1f1b"
        )
    microbatches = p.num_microbatches  # resolved by _check_pipeline
    if microbatches & (microbatches - 1):
        raise ValueError(
            f"distributed.pipeline.num_microbatches={microbatches} with training.deterministic="
            "true: the gradients' tree over the global batch needs a power of two; use 1, 2, "
            "4 or 8"
        )


def _check_training(cfg: TrainConfig) -> None:
    _check_sync_every(cfg)
    _check_deterministic(cfg)
    d = cfg.distributed
    if d.ddp_comm_hook != "no" and d.strategy != "ddp":
        raise ValueError(
            f"distributed.ddp_comm_hook={d.ddp_comm_hook} compresses DDP's all-reduce but "
            f"distributed.strategy={d.strategy}; leave it out (FSDP reduces in "
            f"fsdp_reduce_dtype, ZeRO in the parameters' dtype)"
        )
    if cfg.training.profile_communication and "shardwise" not in cfg.distributed.backend:
        raise ValueError(
            f"training.profile_communication counts the shardwise backend's operations; "
            f"distributed.backend={cfg.distributed.backend} does not report them: use shardwise"
        )
    t, gpt = cfg.training, cfg.model.gpt()
    if gpt.dim % gpt.heads:
        raise ValueError(
            f"model.dim={gpt.dim} is not a multiple of model.heads={gpt.heads}; change one of them"
        )
    if cfg.data.seq_len is not None and cfg.data.seq_len > gpt.seq_len:
        raise ValueError(
            f"data.seq_len={cfg.data.seq_len} exceeds the model's seq_len={gpt.seq_len} "
            f"(its position embeddings); lower data.seq_len or set model.seq_len"
        )
    if t.lr_scaling != "none" and t.base_batch_size is None:
        raise ValueError(
            f"training.lr_scaling={t.lr_scaling} needs training.base_batch_size (the batch "
            f"size training.learning_rate was tuned for); set it or use lr_scaling=none"
        )
    if t.warmup_steps > t.max_steps:
        raise ValueError(
            f"training.warmup_steps={t.warmup_steps} exceeds training.max_steps="
            f"{t.max_steps}; lower the warm-up"
        )
