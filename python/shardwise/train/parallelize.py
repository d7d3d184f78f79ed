"""The parallelisms of ``shardwise-train`` as transforms of one model, applied in a fixed order
(torchtitan's composition):

1. ``tensor_parallel``: the GPT plan over the mesh's tp axis (``shardwise.tensor_parallel``);
2. ``split_pipeline``: the model cut into stages, this rank keeping its own (the pp axis);
3. ``checkpoint_activations``: each transformer block recomputes its activations in backward;
4. ``compile_blocks``: each transformer block's forward compiled by ``torch.compile``;
5. ``data_parallel``: DDP, FSDP or ZeRO 1-3 over the data axis (per stage under a pipeline).

``parallelize(options, axes)`` runs them and returns a ``Parallel``: this rank's stage modules,
the parameters its optimizer steps and where each lies in the full model (so checkpoints do not
depend on the layout), and how a batch goes through it. ``step.py`` is the one train step that
runs over any ``Parallel``. The work happens in the C++ engines (FSDP, ZeRO, the pipeline
executor, the tensor-parallel layers); this module only wires them to the config.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..models.gpt import GPT, GPTConfig
from .seeds import BlockSeeds

DATA_PARALLEL = ("ddp", "fsdp", "zero")  # what runs over the data axis


@dataclass
class StrategyOptions:
    gpt: GPTConfig
    seed: int = 0
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float | None = 1.0
    # no | bf16 | fp16 (training.mixed_precision, the one form from the config to the engines):
    # the forward's autocast (DDP, pipeline; FSDP unless its own mixed precision), ZeRO's
    # parameter dtype; fp16 with dynamic loss scaling
    precision: str = "bf16"
    # no | fp16 | bf16: DDP's all-reduce dtype (distributed.ddp_comm_hook)
    ddp_comm_hook: str = "no"
    initial_loss_scale: float = 2.0**16
    checkpointing: bool = False
    compile: bool = False  # training.compile: the blocks' forwards under torch.compile
    deterministic: bool = False  # training.deterministic: the tree reductions, no DDP wrapper
    optimizer: str = "adamw"  # training.optimizer: adamw | lamb
    fsdp: dict = field(default_factory=dict)  # the FSDP config keys
    zero: dict = field(default_factory=dict)  # DeepSpeed keys
    zero_auto: dict = field(default_factory=dict)  # what their "auto" values become
    pipeline: dict = field(default_factory=dict)  # schedule, num_microbatches, split
    layout: Any = None  # the config's ParallelLayout (TrainConfig.layout(): sizes, mesh)
    sequence_parallel: bool = False
    save_gathered: bool = False  # sequence parallelism: gathered inputs saved for backward
    micro_batch: int = 1  # ZeRO's train_micro_batch_size_per_gpu
    accumulation: int = 1  # ZeRO's gradient_accumulation_steps
    sync_every: int | None = None  # reduce every this many micro-batches (default: the last)
    device: str = "cpu"  # where the model lives: cpu or cuda (this rank's current GPU)
    # another model than the GPT (models.causal_lm.ModelBuilder); ``gpt`` is then its shape
    build: Callable[[], nn.Module] | None = None

    @classmethod
    def from_config(cls, cfg) -> StrategyOptions:
        """The transforms' options, read from a validated ``TrainConfig`` in this one place."""
        t, d = cfg.training, cfg.distributed
        return cls(
            gpt=cfg.run_gpt_config(),
            seed=t.seed,
            clip=t.gradient_clip_norm or None,
            precision=cfg.mixed_precision,
            ddp_comm_hook=d.ddp_comm_hook,
            initial_loss_scale=2.0**t.initial_loss_scale_power,
            checkpointing=cfg.activation_checkpointing,
            compile=t.compile,
            deterministic=t.deterministic,
            optimizer=t.optimizer,
            fsdp=fsdp_keys(d.fsdp or {}, cfg.mixed_precision),
            zero=dict(d.zero or {}),
            zero_auto=cfg.zero_auto(),
            pipeline=d.pipeline.model_dump() if d.pipeline else {},
            layout=cfg.layout(),
            sequence_parallel=d.sequence_parallel,
            save_gathered=d.sequence_parallel_save_gathered,
            micro_batch=t.micro_batch_size,
            accumulation=t.gradient_accumulation_steps,
            sync_every=t.sync_gradients_every,
            device=t.device,
            build=cfg.model._builder,
        )


PARAM_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
COMM_HOOKS = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}


def fsdp_keys(given: dict, precision: str) -> dict:
    """The FSDP keys FSDP runs with: ``training.mixed_precision`` bf16 or fp16 means FSDP's own
    mixed precision in that dtype (parameters all-gathered and computed in it, gradients reduced
    in ``fsdp_reduce_dtype``, fp32 unless given) unless the keys set ``fsdp_mixed_precision``
    themselves; ``fsdp_mixed_precision: false`` keeps fp32 parameters under autocast."""
    keys = dict(given)
    if precision in PARAM_DTYPES and "fsdp_mixed_precision" not in keys:
        keys["fsdp_mixed_precision"] = True
        keys.setdefault("fsdp_param_dtype", PARAM_DTYPES[precision])
    return keys


def casts_parameters(strategy: str, fsdp: dict, precision: str) -> bool:
    """Whether the data-parallel engine holds the parameters in ``precision`` (bf16 / fp16)
    itself, so the model computes in it with no autocast on top: ZeRO, and FSDP under its own
    mixed precision (``fsdp_keys``). Otherwise (DDP, the pipeline, FSDP with
    ``fsdp_mixed_precision: false``) fp32 parameters run under autocast."""
    if precision not in PARAM_DTYPES:
        return False
    if strategy == "zero":
        return True
    return strategy == "fsdp" and bool(fsdp_keys(fsdp, precision).get("fsdp_mixed_precision"))


@dataclass
class Axes:
    """The mesh as the transforms see it: the data axis (``dp`` or ``fsdp``), the pipeline axis
    and the tensor-parallel axis, each a process group (None: the axis has one rank)."""

    data_kind: str = "dp"
    data_group: object = None
    pipeline_group: object = None
    tp_group: object = None
    pipeline_size: int = 1
    pipeline_rank: int = 0
    description: str = ""  # Mesh.describe() of a mesh with a pp or tp axis
    mesh: Any = None  # the run's shardwise.mesh.Mesh (its layout and this rank's place)

    @property
    def data_size(self) -> int:
        return dist.get_world_size(self.data_group) if self.data_group is not None else 1

    @property
    def data_rank(self) -> int:
        return dist.get_rank(self.data_group) if self.data_group is not None else 0


def mesh_axes(strategy: str, options: StrategyOptions, world: int) -> Axes:
    """The process groups, made once, from one ``Mesh`` ``[[p, d, t], ["pp", dp|fsdp, "tp"]]``
    for every strategy: tp innermost, pp outermost (the C++ ``MeshLayout``, which the C++
    trainer uses too, so both place the same ranks together)."""
    from ..mesh import Mesh

    layout = options.layout
    kind = layout.data_axis(strategy)
    if layout.tensor_parallel_size == 1 and layout.pipeline_parallel_size == 1:
        mesh = Mesh.from_layout(layout.layout(kind), create_groups=False)
        return Axes(kind, dist.group.WORLD, mesh=mesh)
    mesh = Mesh.from_layout(layout.layout(kind))
    data_group = mesh.group(kind)
    if data_group is None and strategy in ("pipeline", "fsdp"):
        # FSDP over one rank (an fsdp axis of size 1, pipeline stages' one replica) shards
        # nothing, as torch's FSDP at world 1; None would mean the whole world
        data_group = _one_rank_group(world)
    return Axes(
        kind,
        data_group,
        mesh.group("pp"),
        mesh.group("tp"),
        layout.pipeline_parallel_size,
        mesh.coordinate("pp"),
        mesh.describe(),
        mesh,
    )


def _one_rank_group(world: int):
    """This rank alone as a process group (every rank makes every such group, in order)."""
    mine = None
    for r in range(world):
        group = dist.new_group([r])
        if r == dist.get_rank():
            mine = group
    return mine


@dataclass
class Parallel:
    """A model after the transforms, as this rank holds it."""

    options: StrategyOptions
    axes: Axes
    kind: str  # ddp | fsdp | zero: what runs over the data axis
    gpt: GPT  # the whole (tp-cut) model: its loss, full shapes and tp infos
    stages: dict[int, nn.Module]  # this rank's stages, wrapped; without a pipeline {0: forward}
    params: list[torch.Tensor]  # what the optimizer steps (ZeRO: its engine's own)
    owned: dict = field(default_factory=dict)  # id(p) -> (full name, start, valid, tp runs)
    global_names: dict[int, dict[str, str]] = field(default_factory=dict)  # stage: local->full
    pipelined: bool = False  # cut into stages over the pp axis
    stage_blocks: list[list[int]] = field(default_factory=list)  # the cut: blocks per stage
    stage_names: list[list[str]] = field(default_factory=list)  # every stage's parameters,
    # by full name, a tie's copy left out (the full state gathers each once)
    tied: tuple[str, str] | None = None  # gpt_blocks' tied embedding/head names
    aliases: dict[str, str] = field(default_factory=dict)  # state-dict key -> tied param name
    pipe: object = None  # the pipeline.Pipeline over the wrapped stages
    seeds: object = None  # seeds.BlockSeeds (deterministic mode)
    engine: object = None  # zero.ZeroEngine
    head_copy: int | None = None  # id of the last stage's copy of a tied embedding
    autocast: str = "no"  # the forward's autocast: no, bf16 or fp16
    is_last: bool = True  # holds the last pipeline stage (where the loss is)
    loss_scale: Callable[[], float] = lambda: 1.0  # fp16: set by the step to its scaler's

    @property
    def forward(self) -> nn.Module:
        return self.stages[0]

    @property
    def state_dict_type(self) -> str:
        """What the trainer exports, asked of the FSDP-wrapped stages (all wrapped from one
        config): FSDP's fsdp_state_dict_type, the full model (full_state_dict) or each rank's
        pieces without gathering (sharded_state_dict, local_state_dict); full_state_dict
        without FSDP."""
        from ..fsdp import FullyShardedDataParallel

        kinds = {
            s.state_dict_type
            for s in self.stages.values()
            if isinstance(s, FullyShardedDataParallel)
        }
        return kinds.pop() if len(kinds) == 1 else "full_state_dict"

    @functools.cached_property
    def split(self) -> set[int]:
        """ids of the parameters split over the tp axis (read once ``owned`` is complete)."""
        return {k for k, v in self.owned.items() if v[3] is not None}

    def no_sync(self, last: bool):
        """No gradient reduction before the last micro-batch (DDP, FSDP); ZeRO-2 reduces into
        its partition every micro-batch, the pipeline averages after its step."""
        if last or self.pipelined or self.kind == "zero":
            return contextlib.nullcontext()
        return getattr(self.forward, "no_sync", contextlib.nullcontext)()

    def tp_runs(self, name: str, p: torch.Tensor):
        """Where this rank's tp shard of parameter ``name`` lies in the full parameter
        (``tensor_parallel.shard_runs``); None for a parameter that is not split."""
        from .. import tensor_parallel as tp

        if self.axes.tp_group is None or tp.tp_info(p) is None:
            return None
        return tp.shard_runs(self.gpt.full_shapes[name], tp.tp_info(p), self.axes.tp_group)


def parallelize(options: StrategyOptions, axes: Axes, kind: str, pipeline: bool) -> Parallel:
    """The transforms in their order; ``kind``: ddp, fsdp or zero over the data axis;
    ``pipeline``: cut into stages over the pp axis."""
    if kind not in DATA_PARALLEL:
        raise ValueError(f"data parallelism {kind!r}: use one of {', '.join(DATA_PARALLEL)}")
    if pipeline and kind == "zero":
        raise ValueError("ZeRO with a pipeline is not supported; use dp or fsdp stages")
    model = build_model(options)
    tensor_parallel(model, options, axes)
    par = split_pipeline(model, options, axes, kind, pipeline)
    if options.deterministic:  # dropout by (step, micro-batch, block), whatever the cut
        par.seeds = BlockSeeds(list(model.blocks), options.seed)
    if not (kind == "fsdp" and not par.pipelined):  # FSDP's units checkpoint themselves
        checkpoint_activations(model, options)
    compile_blocks(model, options)
    data_parallel(par)
    return par


def build_model(options: StrategyOptions) -> GPT:
    """The GPT (or ``options.build``'s model), identically initialized on every rank (the seed,
    not a broadcast; on the CPU, so every device starts from the same weights), then moved to
    ``options.device``."""
    torch.manual_seed(options.seed)
    model = options.build() if options.build is not None else GPT(options.gpt)
    model.full_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    return model.to(options.device)


def tensor_parallel(model: GPT, options: StrategyOptions, axes: Axes) -> None:
    """1. The GPT plan (a Hugging Face model: its family's plan) over the tp axis (nothing
    without one)."""
    if axes.tp_group is not None:
        from .. import tensor_parallel as tp
        from ..models.causal_lm import CausalLM

        if isinstance(model, CausalLM):
            from ..models.causal_lm import PREFIX

            plan = tp.hf_plan(model.config, PREFIX)
        else:
            sp, keep = options.sequence_parallel, options.save_gathered
            plan = tp.gpt_plan(model, sp, save_gathered=keep)
        tp.parallelize(model, axes.tp_group, plan)


def model_blocks(model) -> tuple[list[nn.Module], tuple[str, str] | None]:
    """The model as a chain of pipeline blocks and its tied (first, last) names: the GPT's
    ``gpt_blocks``, a Hugging Face model's ``causal_lm_blocks``."""
    from .. import pipeline as pp
    from ..models.causal_lm import CausalLM

    if isinstance(model, CausalLM):
        from ..pipeline.hf_stages import causal_lm_blocks

        return causal_lm_blocks(model)
    return pp.gpt_blocks(model)


def checkpoint_activations(model: GPT, options: StrategyOptions) -> None:
    """3. Each transformer block recomputes its activations in backward (the pipeline's stages
    hold the same block objects, so this reaches them too)."""
    if options.checkpointing:
        from .recompute import checkpoint_blocks

        checkpoint_blocks(model.blocks)


def compile_blocks(model: GPT, options: StrategyOptions) -> None:
    """4. Each transformer block's ``forward`` compiled by ``torch.compile`` (torchtitan's
    per-block compilation: the blocks share one code object, so one graph serves them all).
    The forward, not the module's call: the hooks the engines hang on a block (FSDP's and
    ZeRO-3's gather before it, their reshard after it) stay outside the graph, while what the
    block itself calls (tensor parallelism's collectives, custom ops with fake kernels;
    activation checkpointing) is traced into it. The pipeline's stages hold the same blocks."""
    if not options.compile:
        return
    for block in model.blocks:
        block.forward = torch.compile(block.forward)


def compile_counts() -> dict:
    """What ``torch.compile`` made of this process's code so far (dynamo's counters): the
    graphs compiled, the graph breaks by reason and the frames it gave up on (eager)."""
    from torch._dynamo.utils import counters

    breaks: dict[str, int] = {}
    for reason, count in counters["graph_break"].items():
        short = reason.splitlines()[0]  # dynamo's reason, and what it could not trace
        called = re.search(r"qualname: ([\w.]+)", reason)
        short += f": {called[1].rsplit('.', 1)[-1]}" if called else ""
        breaks[short] = breaks.get(short, 0) + count
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": breaks,
        "frames_not_compiled": int(counters["frames"]["total"] - counters["frames"]["ok"]),
    }


def split_pipeline(
    model: GPT, options: StrategyOptions, axes: Axes, kind: str, pipeline: bool
) -> Parallel:
    """2. With a pipeline axis: the GPT cut into ``p × virtual_stages`` stages (by parameters or
    by time), this rank's kept; a tied embedding/head pair stays tied across the first and last
    stage. Without one: the whole model as stage 0."""
    par = Parallel(options, axes, kind, model, {0: model}, [])
    if not pipeline:
        par.global_names = {0: {n: n for n, _ in model.named_parameters()}}
        return par
    from .. import pipeline as pp

    cfg = options.pipeline
    p, v = axes.pipeline_size, int(cfg.get("virtual_stages", 1))
    names = {id(t): n for n, t in model.named_parameters()}
    par.aliases = {  # a tied head's key in the full state dict, as the embedding's name
        k: names[id(t)]
        for k, t in model.state_dict(keep_vars=True).items()
        if id(t) in names and names[id(t)] != k
    }
    blocks, tied = model_blocks(model)
    if tied:  # the last block's copy of the tied weight has the original's full name
        copy = dict(blocks[-1].named_parameters())[tied[1]]
        names[id(copy)] = names[id(dict(blocks[0].named_parameters())[tied[0]])]
    groups = _stage_groups(blocks, p * v, options, axes)
    par.stages = {}
    for s in range(axes.pipeline_rank, p * v, p):
        body = nn.Sequential(*(blocks[i] for i in groups[s]))
        par.global_names[s] = {n: names[id(t)] for n, t in body.named_parameters()}
        par.stages[s] = _AutocastStage(body, options.precision, options.device)
        if cfg.get("schedule", "1f1b") == "zb_h1":
            pp.defer_weight_gradients(par.stages[s])
    par.head_copy = id(copy) if tied else None
    par.stage_names = [
        [names[id(t)] for i in g for t in blocks[i].parameters() if id(t) != par.head_copy]
        for g in groups
    ]
    par.pipelined, par.stage_blocks, par.tied = True, groups, tied
    return par


def _stage_groups(blocks, count: int, options: StrategyOptions, axes: Axes) -> list[list[int]]:
    """The blocks of each stage: by parameter count, or by time measured on rank 0 alone and
    shared. With tensor parallelism rank 0 times a copy cut over a process group whose
    collectives do nothing (its tp peers are busy elsewhere): the compute of one tp rank."""
    from .. import pipeline as pp

    if options.pipeline.get("split", "parameters") != "time":
        return pp.split_by_parameters(blocks, count)
    groups = None
    if dist.get_rank() == 0:
        loss = _plain_loss
        if axes.tp_group is not None:
            from .gpt_costs import shape_only_group

            rng = torch.get_rng_state()  # the copy's init leaves the RNG as other ranks'
            model = build_model(options)
            torch.set_rng_state(rng)
            fake = replace(axes, tp_group=shape_only_group(axes.tp_group.size()))
            tensor_parallel(model, options, fake)
            blocks, loss = model_blocks(model)[0], model.cross_entropy  # vocabulary-parallel
        g = torch.Generator().manual_seed(0)  # leaves the global RNG as other ranks'
        sample = torch.randint(0, options.gpt.vocab_size, (1, options.gpt.seq_len + 1), generator=g)
        sample = sample.to(options.device)
        with autocast_context(options.precision, options.device):
            groups = pp.split_by_time(blocks, count, sample[:, :-1], 2, loss, sample[:, 1:])
    return pp.broadcast_groups(groups)


def _plain_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_context(precision: str, device: str = "cpu"):
    """Autocast to ``precision`` (bf16, fp16) on ``device``'s type (cpu, cuda); nothing for no."""
    if precision == "no":
        return contextlib.nullcontext()
    return torch.autocast(device, dtype=AUTOCAST_DTYPES[precision])


class _AutocastStage(nn.Module):
    """A pipeline stage under autocast whose output crosses to the next stage in fp32."""

    def __init__(self, body: nn.Module, precision: str, device: str = "cpu"):
        super().__init__()
        self.body, self.precision, self.device = body, precision, device

    def forward(self, x):
        with autocast_context(self.precision, self.device):
            out = self.body(x)
        return out.float() if out.is_floating_point() else out


# --- 4. data parallelism --------------------------------------------------------------------


def data_parallel(par: Parallel) -> None:
    """4. DDP, FSDP or ZeRO over the data axis; then this rank's parameters and where each lies
    in the full model, and (with a pipeline) the executor over the wrapped stages."""
    if par.kind == "zero":
        _zero(par)
        return
    if par.pipelined:
        _pipeline_data_parallel(par)
        return
    o, model = par.options, par.gpt
    if par.kind == "fsdp":
        from ..fsdp import wrap
        from ..fsdp.config import FSDPConfig

        cfg = FSDPConfig.from_mapping(
            {**o.fsdp, "use_fsdp": True, "gradient_checkpointing": o.checkpointing}
        )
        wrapped = wrap(model, cfg, process_group=par.axes.data_group,
                       deterministic=o.deterministic)  # fmt: skip
        named = dict(model.named_parameters())
        par.owned = {
            k: (n, a, c, par.tp_runs(n, named[n])) for k, (n, a, c) in _fsdp_slots(wrapped).items()
        }
        par.autocast = "no" if casts_parameters("fsdp", o.fsdp, o.precision) else o.precision
    else:
        wrapped = model
        # deterministic: the step reduces each micro-batch itself, by the tree (no DDP buckets)
        if par.axes.data_size > 1 and not o.deterministic:
            wrapped = nn.parallel.DistributedDataParallel(model, process_group=par.axes.data_group)
            if o.ddp_comm_hook != "no":
                wrapped.register_comm_hook(par.axes.data_group, COMM_HOOKS[o.ddp_comm_hook])
        par.owned = {
            id(p): (n, 0, p.numel(), par.tp_runs(n, p)) for n, p in model.named_parameters()
        }
        par.autocast = o.precision
    par.stages = {0: wrapped}
    par.params = [p for p in wrapped.parameters() if p.requires_grad]


def _zero(par: Parallel) -> None:
    """ZeRO 1-3 (the C++ ZeroOptimizer) with DeepSpeed's keys; it casts the model itself (no
    autocast) and keeps its own checkpoint pieces."""
    from ..zero import ZeroEngine

    o = par.options
    config = {
        "train_micro_batch_size_per_gpu": o.micro_batch,
        "gradient_accumulation_steps": o.accumulation,
        "bf16": {"enabled": o.precision == "bf16"},
        "fp16": {
            "enabled": o.precision == "fp16",
            "initial_scale_power": round(math.log2(o.initial_loss_scale)),
        },
        "gradient_clipping": o.clip or 0.0,
        "optimizer": {
            "type": "Lamb" if o.optimizer == "lamb" else "AdamW",
            "params": {"betas": list(o.betas), "weight_decay": o.weight_decay},
        },
        **o.zero,
    }
    group = par.axes.data_group or dist.group.WORLD
    par.engine = ZeroEngine(par.gpt, config, group, par.axes.tp_group, o.zero_auto,
                            deterministic=o.deterministic)  # fmt: skip
    par.stages = {0: par.engine}
    par.autocast = "no"  # the engine casts the model itself (casts_parameters)


def _pipeline_data_parallel(par: Parallel) -> None:
    """Each stage replicated (the Pipeline averages the replicas' gradients) or FSDP-sharded."""
    from .. import pipeline as pp
    from ..fsdp import wrap

    axes, fsdp = par.axes, par.kind == "fsdp"
    for s, stage in list(par.stages.items()):
        to_global = par.global_names[s]
        local = dict(stage.named_parameters())
        runs = {n: par.tp_runs(to_global[n.removeprefix("body.")], t) for n, t in local.items()}
        if fsdp:  # the config's FSDP keys; the blocks already checkpoint themselves
            keys = {**par.options.fsdp, "use_fsdp": True, "gradient_checkpointing": False}
            if keys.get("fsdp_mixed_precision"):
                stage.precision = "no"  # FSDP casts; no autocast on top
            stage = wrap(stage, keys, process_group=axes.data_group, one_unit=True)
            for k, (n, a, c) in _fsdp_slots(stage).items():
                par.owned[k] = (to_global[n.removeprefix("body.")], a, c, runs[n])
        else:
            for n, t in local.items():
                par.owned[id(t)] = (to_global[n.removeprefix("body.")], 0, t.numel(), runs[n])
        par.stages[s] = stage
    tied, groups = par.tied, par.stage_blocks
    cfg = par.options.pipeline
    p, v = axes.pipeline_size, int(cfg.get("virtual_stages", 1))
    ties = []
    if tied:
        last, prefix = p * v - 1, "module.body." if fsdp else "body."
        ties = [(0, f"{prefix}0.{tied[0]}", last, f"{prefix}{len(groups[last]) - 1}.{tied[1]}")]
    schedule = pp.make_schedule(
        cfg.get("schedule", "1f1b"), p, int(cfg.get("num_microbatches", p)), v
    )
    par.is_last = (p * v - 1) in par.stages
    par.pipe = pp.Pipeline(
        par.stages,
        schedule,
        # the vocabulary-parallel loss under tensor parallelism; fp16: times the loss scale
        lambda out, y: par.gpt.cross_entropy(out, y) * par.loss_scale(),
        group=axes.pipeline_group,
        rank=axes.pipeline_rank,
        data_parallel_group=axes.data_group,
        tied=ties,
        deterministic=par.options.deterministic,
        accumulation=par.options.accumulation if par.options.deterministic else 1,
        before_forward=par.seeds.before_stage_forward if par.seeds is not None else None,
    )
    par.params = [t for st in par.stages.values() for t in st.parameters()]


def _fsdp_slots(fsdp) -> dict[int, tuple[str, int, int]]:
    """id(shard parameter) -> (name, start, valid elements) of what this rank owns."""
    return {id(s.parameter): (s.name, s.start, s.valid) for s in fsdp.owned_slices()}
