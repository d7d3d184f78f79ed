"""The parallelism strategies of ``shardwise-train`` behind one interface.

Each strategy owns the wrapped model and its optimizer and offers:

- ``train_step(batches, lr)``: one optimizer step over the gradient-accumulation micro-batches
  (``batches``: a list of (inputs, targets)); returns the loss (mean over the micro-batches and
  the data-parallel ranks) and the gradient norm before clipping;
- ``save_slots()`` / ``load_slots()``: what this rank saves / owns of every parameter and AdamW
  moment, as ``pieces.Slot``s, so checkpoints are world-size independent (``pieces.py``); ZeRO
  keeps its C++ pieces (``payload()`` / ``load_payloads()``);
- ``full_state_dict()``: the plain GPT's state dict on rank 0 (collective), for export and
  sampling.

The model code is the bundled GPT; the work happens in the C++ engines (FSDP, ZeRO, pipeline
executor) and the fused AdamW. This module only wires them to the config.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..models.gpt import GPT, GPTConfig
from ..optim import FusedAdamW
from .pieces import Slot


@dataclass
class StrategyOptions:
    gpt: GPTConfig
    seed: int = 0
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float | None = 1.0
    bf16: bool = True  # autocast the forward (DDP, pipeline; FSDP unless its own mixed precision)
    fp16: bool = False  # fp16 autocast (ZeRO: fp16 parameters) with dynamic loss scaling
    initial_loss_scale: float = 2.0**16
    checkpointing: bool = False
    fsdp: dict = field(default_factory=dict)  # seed-002 keys
    zero: dict = field(default_factory=dict)  # DeepSpeed keys
    pipeline: dict = field(default_factory=dict)  # schedule, num_microbatches, split
    mesh: list | None = None  # [[d, p], [kind, "pp"]] for the pipeline
    tensor_parallel: int = 1  # the tp axis of a [[d, t], [kind, "tp"]] mesh (ddp and fsdp)
    sequence_parallel: bool = False
    tp_group: object = None  # set by the trainer from the mesh


def build_model(options: StrategyOptions, checkpoint_blocks: bool | None = None) -> GPT:
    """The GPT, identically initialized on every rank (the seed, not a broadcast); with
    activation checkpointing, each block recomputes its activations in backward."""
    torch.manual_seed(options.seed)
    model = GPT(options.gpt)
    model.full_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if options.tp_group is not None:  # the transforms in order: TP, then checkpointing
        from .. import tensor_parallel as tp

        tp.parallelize(model, options.tp_group, tp.gpt_plan(model, options.sequence_parallel))
    if options.checkpointing if checkpoint_blocks is None else checkpoint_blocks:
        for block in model.blocks:
            forward = block.forward
            block.forward = lambda x, f=forward: torch.utils.checkpoint.checkpoint(
                f, x, use_reentrant=False
            )
    return model


def _autocast(enabled: bool, fp16: bool = False):
    if fp16:
        return torch.autocast("cpu", dtype=torch.float16)
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def _grad_scaler(options: StrategyOptions):
    """fp16: the C++ GradScaler (dynamic loss scaling, overflow agreed over the whole world, so
    data, tensor and pipeline ranks skip the same steps); None otherwise."""
    if not options.fp16:
        return None
    from .. import _C

    return _C.GradScaler(initial_scale=options.initial_loss_scale, group=dist.group.WORLD)


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _adamw(params, options: StrategyOptions) -> FusedAdamW:
    """The fused AdamW with its moments created now (so a checkpoint can fill them)."""
    params = [p for p in params if p.requires_grad]
    opt = FusedAdamW(params, lr=0.0, betas=options.betas, weight_decay=options.weight_decay)
    for p in params:
        opt.state[p] = {
            "step": 0,
            "exp_avg": torch.zeros_like(p, memory_format=torch.contiguous_format),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.contiguous_format),
        }
    return opt


def _mean_over(value: float, group) -> float:
    if group is None or dist.get_world_size(group) == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


class Strategy:
    """Shared parts: the optimizer's slots and its step with a learning rate."""

    name = "?"
    state_bytes = 0  # model_state_bytes() at the end of the last step, before zero_grad
    data_group = None  # the data-parallel ranks (None: just this rank)
    optimizer: FusedAdamW

    def optimizer_step_count(self) -> int:
        return max((int(s["step"]) for s in self.optimizer.state.values()), default=0)

    def model_state_bytes(self) -> int:
        """Bytes this rank holds now for parameters, gradients and optimizer state (tensor
        storages, each counted once), to compare with the planner's estimate."""
        tensors = [*self._parameters()]
        tensors += [t.grad for t in self._parameters() if t.grad is not None]
        tensors += [
            v
            for st in self.optimizer.state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor)
        ]
        seen, total = set(), 0
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    def _parameters(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def set_optimizer_step_count(self, step: int) -> None:
        for state in self.optimizer.state.values():
            state["step"] = int(step)

    scaler = None  # fp16: the GradScaler the losses were multiplied by
    mesh_description = ""  # with tensor parallelism: the mesh's groups (Mesh.describe())

    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler is not None else 1.0

    def _step(self, lr: float, clip_norm) -> float:
        """Unscales (fp16: a step with a non-finite gradient on any rank is skipped, on every
        rank, and the scale lowered), clips (``clip_norm()`` returns the norm before clipping),
        steps, zeroes."""
        if self.scaler is not None:
            grads = [p.grad for p in self._parameters() if p.grad is not None]
            if self.scaler.update(self.scaler.unscale_(grads)):
                self.state_bytes = self.model_state_bytes()
                self.optimizer.zero_grad(set_to_none=True)
                return math.inf
        norm = clip_norm()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.state_bytes = self.model_state_bytes()  # the peak: gradients are still there
        self.optimizer.zero_grad(set_to_none=True)
        return norm


class DDPStrategy(Strategy):
    """Replicated model (torch DDP over the process group), fused AdamW."""

    name = "ddp"

    def __init__(self, options: StrategyOptions, group=None):
        self.options = options
        self.model = build_model(options)
        self.data_group = group
        self.wrapped = self.model
        if group is not None and dist.get_world_size(group) > 1:
            self.wrapped = nn.parallel.DistributedDataParallel(self.model, process_group=group)
        self.optimizer = _adamw(self.model.parameters(), options)
        self.scaler = _grad_scaler(options)
        self._owned = {
            id(p): (n, 0, p.numel(), _tp_runs(self.model, n, p, options.tp_group))
            for n, p in self.model.named_parameters()
        }

    def train_step(self, batches, lr: float) -> dict:
        total = 0.0
        no_sync = getattr(self.wrapped, "no_sync", contextlib.nullcontext)
        for k, (x, y) in enumerate(batches):
            # the backward must run inside no_sync too, or every micro-batch all-reduces
            with contextlib.nullcontext() if k == len(batches) - 1 else no_sync():
                with _autocast(self.options.bf16, self.options.fp16):
                    loss = self.model.cross_entropy(self.wrapped(x), y) / len(batches)
                (loss * self.loss_scale()).backward()
            total += loss.item()
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = self._step(lr, lambda: _clip(params, self.options.clip, self.options.tp_group))
        return {"loss": _mean_over(total, self.data_group), "grad_norm": norm}

    def save_slots(self) -> list[Slot]:
        rank0 = self.data_group is None or dist.get_rank(self.data_group) == 0
        # replicated over the data axis: its rank 0 saves for all (and of the tp ranks, each
        # saves its splits, tp rank 0 the replicated parameters)
        return _tp_filter(self.load_slots(), self.options.tp_group) if rank0 else []

    def load_slots(self) -> list[Slot]:
        return _owned_slots(self.model.parameters(), self._owned, self.optimizer)

    def full_state_dict(self) -> dict:
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return _gather_tp(self.model, state, self.options.tp_group)


def _clip(params: list[torch.Tensor], max_norm: float | None, tp_group=None) -> float:
    if tp_group is not None:
        from .. import tensor_parallel as tp

        return tp.clip_grad_norm_(params, max_norm or 0.0, tp_group)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else math.inf)
    return float(norm)


def _tp_runs(model: nn.Module, name: str, p: torch.Tensor, tp_group):
    """Where this rank's tensor-parallel shard of parameter ``name`` lies in the full
    parameter (``tensor_parallel.shard_runs``), None for a parameter that is not split."""
    from .. import tensor_parallel as tp

    if tp_group is None or tp.tp_info(p) is None:
        return None
    return tp.shard_runs(model.full_shapes[name], tp.tp_info(p), tp_group)


def _tp_filter(slots: list[Slot], tp_group) -> list[Slot]:
    """Drops the replicated parameters' slots on tp ranks other than 0 (they hold copies)."""
    if tp_group is None or dist.get_rank(tp_group) == 0:
        return slots
    return [s for s in slots if s.tp_split]


def _gather_tp(model: nn.Module, state: dict, tp_group) -> dict:
    """The full tensors of a state dict of tensor-parallel shards (collective over tp)."""
    if tp_group is None:
        return state
    from .. import tensor_parallel as tp

    infos = {n: tp.tp_info(p) for n, p in model.named_parameters(remove_duplicate=False)}
    return {n: tp.full_tensor(t, infos.get(n), tp_group) for n, t in state.items()}


def _fsdp_slots(fsdp, full_numels: dict[str, int]) -> dict[int, tuple[str, int, int]]:
    """id(shard parameter) -> (name, start, valid elements) of what this rank owns."""
    from ..ops import sharding as layout

    engine, owned = fsdp._engine, {}
    for unit, params in enumerate(fsdp._unit_params):
        rank, size = engine.shard_rank(unit), engine.shard_size(unit)
        for p in params:
            name = fsdp._names[id(p)][0]
            full = full_numels[name]
            start = min(rank * layout.chunk(full, size), full) if size > 1 else 0
            owned[id(p)] = (name, start, max(0, min(p.numel(), full - start)))
    return owned


class FSDPStrategy(Strategy):
    """shardwise FSDP (the C++ engine) with the seed-002 keys; fused AdamW on the shards."""

    name = "fsdp"

    def __init__(self, options: StrategyOptions, group=None):
        from ..fsdp import wrap
        from ..fsdp.config import FSDPConfig

        self.options = options
        model = build_model(options, checkpoint_blocks=False)  # FSDP's units checkpoint
        full = {n: p.numel() for n, p in model.named_parameters()}
        cfg = FSDPConfig.from_mapping(
            {
                **options.fsdp,
                "use_fsdp": True,
                "gradient_checkpointing": options.checkpointing,
            }
        )
        self.own_precision = bool(cfg.fsdp_mixed_precision)
        self.gpt = model
        self.model = wrap(model, cfg, process_group=group)
        self.data_group = group or dist.group.WORLD
        self.optimizer = _adamw(self.model.parameters(), options)
        self.scaler = _grad_scaler(options)
        self._owned = _fsdp_slots(self.model, full)
        named = dict(model.named_parameters())
        self._split = set()
        if options.tp_group is not None:  # FSDP shards of tensor-parallel shards
            for k, (n, a, c) in self._owned.items():
                runs = _tp_runs(model, n, named[n], options.tp_group)
                self._owned[k] = (n, a, c, runs)
                if runs is not None:
                    self._split.add(k)

    def train_step(self, batches, lr: float) -> dict:
        total = 0.0
        autocast = self.options.bf16 and not self.own_precision
        for k, (x, y) in enumerate(batches):
            last = k == len(batches) - 1
            # the backward must run inside no_sync too, or every micro-batch reduce-scatters
            with contextlib.nullcontext() if last else self.model.no_sync():
                with _autocast(autocast, self.options.fp16 and not self.own_precision):
                    loss = self.gpt.cross_entropy(self.model(x), y) / len(batches)
                (loss * self.loss_scale()).backward()
            total += loss.item()
        clip = self.options.clip or math.inf
        norm = self._step(lr, lambda: self._clip(clip))
        return {"loss": _mean_over(total, self.data_group), "grad_norm": norm}

    def _clip(self, clip: float) -> float:
        if self.options.tp_group is None:
            return float(self.model.clip_grad_norm_(clip))
        from .. import tensor_parallel as tp

        return tp.clip_grad_norm_(
            self.model.parameters(),
            0.0 if math.isinf(clip) else clip,
            self.options.tp_group,
            split=self._split,
            shard_group=self.data_group,
        )

    def save_slots(self) -> list[Slot]:
        return _tp_filter(self.load_slots(), self.options.tp_group)

    def load_slots(self) -> list[Slot]:
        return _owned_slots(self.model.parameters(), self._owned, self.optimizer)

    def full_state_dict(self) -> dict:
        from ..fsdp import state_dict as fsdp_state

        state = fsdp_state.get(self.model, "full_state_dict")
        return _gather_tp(self.gpt, state, self.options.tp_group)


def _owned_slots(params, owned: dict, optimizer) -> list[Slot]:
    """Slots of parameters and their AdamW moments: owned[id(p)] = (name, start, valid) or
    (name, start, valid, runs): ``p`` holds elements [start, start + valid) of the parameter,
    or, with tensor-parallel ``runs``, of this rank's shard, which the runs place in the full
    parameter (one slot per run it overlaps)."""
    slots = []
    for p in params:
        if id(p) not in owned:
            continue
        name, start, valid, *rest = owned[id(p)]
        runs = rest[0] if rest else None
        state = optimizer.state.get(p)
        for full_start, offset, length in _pieces(start, valid, runs):
            views = [(name, p.data)]
            views += [(f"{name}:{k}", state[k]) for k in ("exp_avg", "exp_avg_sq") if state]
            for slot_name, tensor in views:
                view = tensor.view(-1)[offset : offset + length]
                slots.append(Slot(slot_name, full_start, view, tp_split=runs is not None))
    return slots


def _pieces(start: int, valid: int, runs) -> list[tuple[int, int, int]]:
    """(full_start, offset in p, length) of local elements [start, start + valid)."""
    if runs is None:
        return [(start, 0, valid)]
    out = []
    for full_start, local_start, length in runs:
        lo, hi = max(start, local_start), min(start + valid, local_start + length)
        if lo < hi:
            out.append((full_start + lo - local_start, lo - start, hi - lo))
    return out


class ZeroStrategy(Strategy):
    """shardwise ZeRO stages 0-3 (C++ ZeroOptimizer) with DeepSpeed's keys. Its checkpoint is
    the optimizer's own world-size-independent pieces (``payload()`` / ``load_payloads()``)."""

    name = "zero"

    def __init__(
        self, options: StrategyOptions, group=None, accumulation: int = 1, micro_batch: int = 1
    ):
        from ..zero import ZeroEngine

        self.options = options
        config = {
            "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": accumulation,
            "bf16": {"enabled": options.bf16},
            "fp16": {"enabled": options.fp16},
            "gradient_clipping": options.clip or 0.0,
            "optimizer": {
                "type": "AdamW",
                "params": {"betas": list(options.betas), "weight_decay": options.weight_decay},
            },
            **options.zero,
        }
        self.data_group = group or dist.group.WORLD
        self.engine = ZeroEngine(build_model(options), config, self.data_group)

    def train_step(self, batches, lr: float) -> dict:
        self.engine.set_lr(lr)
        total = 0.0
        for x, y in batches:
            loss = gpt_loss(self.engine(x), y)
            self.engine.backward(loss)
            total += loss.item() / len(batches)
        self.state_bytes = self.model_state_bytes()  # the peak: before the step frees gradients
        self.engine.step()
        norm = float(self.engine.optimizer.last_grad_norm())
        return {"loss": _mean_over(total, self.data_group), "grad_norm": norm}

    def payload(self) -> dict:
        return self.engine.optimizer_state()

    def load_payloads(self, payloads: list[dict]) -> None:
        self.engine.load_optimizer_states(payloads)

    def optimizer_step_count(self) -> int:
        return int(self.engine.optimizer.step_count())

    def model_state_bytes(self) -> int:
        return sum(self.engine.memory_bytes().values())

    def full_state_dict(self) -> dict:
        from ..fsdp import state_dict as fsdp_state

        if self.engine.stage == 3:
            return fsdp_state.get(self.engine.module, "full_state_dict")
        return {k: v.detach().float() for k, v in self.engine.module.state_dict().items()}


class _AutocastStage(nn.Module):
    """A pipeline stage under bf16 autocast whose output crosses to the next stage in fp32."""

    def __init__(self, body: nn.Module, bf16: bool, fp16: bool = False):
        super().__init__()
        self.body, self.bf16, self.fp16 = body, bf16, fp16

    def forward(self, x):
        with _autocast(self.bf16, self.fp16):
            out = self.body(x)
        return out.float() if out.is_floating_point() else out


class PipelineStrategy(Strategy):
    """The GPT cut into stages (``pipeline.split``: parameters or time) on a data × pipeline
    mesh, run by the C++ executor under ``pipeline.schedule``; a tied embedding/head pair is
    kept tied across the first and last stage. Stages are replicated (dp) or FSDP-sharded."""

    name = "pipeline"

    def __init__(self, options: StrategyOptions, world: int, mesh=None):
        from .. import pipeline as pp
        from ..fsdp import FullyShardedDataParallel

        self.options = options
        cfg = options.pipeline
        # with tensor parallelism the trainer's 3-D mesh (pp outermost, tp innermost)
        self.mesh = mesh or pp.MeshGroups(options.mesh or [[1, world], ["dp", "pp"]])
        tp_group = options.tp_group
        p, v = self.mesh.pipeline_size, int(cfg.get("virtual_stages", 1))
        kind = cfg.get("schedule", "1f1b")
        model = build_model(options)
        self.gpt = model
        names = {id(t): n for n, t in model.named_parameters()}
        blocks, tied = pp.gpt_blocks(model)
        names[id(blocks[-1].head.weight)] = "embed.weight"  # the head's copy of the tie
        if cfg.get("split", "parameters") == "time":  # timed on rank 0 alone, then shared
            groups = None
            if dist.get_rank() == 0:
                g = torch.Generator().manual_seed(0)  # leaves the global RNG as other ranks'
                shape = (1, options.gpt.seq_len + 1)
                sample = torch.randint(0, options.gpt.vocab_size, shape, generator=g)
                with _autocast(options.bf16):
                    groups = pp.split_by_time(
                        blocks, p * v, sample[:, :-1], 2, gpt_loss, sample[:, 1:]
                    )
            groups = pp.broadcast_groups(groups)
        else:
            groups = pp.split_by_parameters(blocks, p * v)
        self.stage_ids = [s for s in range(p * v) if s % p == self.mesh.pipeline_rank]
        self.stages, self.global_names, self._owned, self._tp_infos = {}, {}, {}, {}
        for s in self.stage_ids:
            body = nn.Sequential(*(blocks[i] for i in groups[s]))
            self.global_names[s] = {n: names[id(t)] for n, t in body.named_parameters()}
            stage = _AutocastStage(body, options.bf16, options.fp16)
            if kind == "zb_h1":
                pp.defer_weight_gradients(stage)
            local = dict(stage.named_parameters())
            for n, t in local.items():
                self._tp_infos[self.global_names[s][n.removeprefix("body.")]] = getattr(
                    t, "tp_shard", None
                )
            runs = {  # where a tensor-parallel shard lies in the full parameter
                n: _tp_runs(model, self.global_names[s][n.removeprefix("body.")], t, tp_group)
                for n, t in local.items()
            }
            if self.mesh.data_kind == "fsdp":
                full = {n: t.numel() for n, t in stage.named_parameters()}
                stage = FullyShardedDataParallel(stage, process_group=self.mesh.data_group)
                owned = _fsdp_slots(stage, full)
                self._owned.update(
                    {
                        k: (self.global_names[s][n.removeprefix("body.")], a, c, runs[n])
                        for k, (n, a, c) in owned.items()
                    }
                )
            else:
                for n, t in stage.named_parameters():
                    self._owned[id(t)] = (
                        self.global_names[s][n.removeprefix("body.")],
                        0,
                        t.numel(),
                        runs[n],
                    )
            self.stages[s] = stage
        self.tied = []
        if tied:
            last = p * v - 1
            prefix = lambda s: "body." if self.mesh.data_kind != "fsdp" else "module.body."  # noqa: E731
            self.tied = [
                (
                    0,
                    prefix(0) + "0." + tied[0],
                    last,
                    f"{prefix(last)}{len(groups[last]) - 1}.{tied[1]}",
                )
            ]
        schedule = pp.make_schedule(kind, p, int(cfg.get("num_microbatches", p)), v)
        self.pipe = pp.Pipeline(
            self.stages,
            schedule,
            # the vocabulary-parallel loss under tensor parallelism; fp16: times the loss scale
            lambda out, y: model.cross_entropy(out, y) * self.loss_scale(),
            group=self.mesh.pipeline_group,
            rank=self.mesh.pipeline_rank,
            data_parallel_group=self.mesh.data_group,
            tied=self.tied,
        )
        self.params = [t for st in self.stages.values() for t in st.parameters()]
        self._split = {k for k, v in self._owned.items() if v[3] is not None}
        self.optimizer = _adamw(self.params, options)
        self.scaler = _grad_scaler(options)
        self.data_group = self.mesh.data_group
        self._head_copy = id(blocks[-1].head.weight) if tied else None
        self.is_last = (p * v - 1) in self.stages

    def train_step(self, batches, lr: float) -> dict:
        total = 0.0
        for x, y in batches:
            total += self.pipe.step(x, y) / len(batches) / self.loss_scale()
        if len(batches) > 1:
            for t in self.params:
                if t.grad is not None:
                    t.grad.div_(len(batches))
        norm = self._step(lr, self._clip)
        loss = torch.tensor([total if self.is_last else 0.0], dtype=torch.float64)
        dist.all_reduce(loss, group=self.mesh.pipeline_group)  # only the last stage's is nonzero
        return {"loss": _mean_over(loss.item(), self.data_group), "grad_norm": norm}

    def _clip(self) -> float:
        """The global norm: squares of what this rank owns (the head's tied copy once), summed
        over the mesh; replicated stages count once (divided by the data-parallel size), and so
        do parameters replicated over the tp ranks (divided by the tp size)."""
        tp = dist.get_world_size(self.options.tp_group) if self.options.tp_group else 1
        sq = sum(
            t.grad.float().pow(2).sum().item() / (1 if id(t) in self._split else tp)
            for t in self.params
            if t.grad is not None and id(t) != self._head_copy
        )
        total = torch.tensor([sq], dtype=torch.float64)
        dist.all_reduce(total)
        if self.mesh.data_kind == "dp":
            total /= self.mesh.data_size
        norm = math.sqrt(total.item())
        clip = self.options.clip
        if clip and norm > clip:
            for t in self.params:
                if t.grad is not None:
                    t.grad.mul_(clip / (norm + 1e-6))
        return norm

    def save_slots(self) -> list[Slot]:
        if self.mesh.data_kind == "dp" and self.mesh.data_rank != 0:
            return []
        return [
            s
            for s in _tp_filter(self.load_slots(), self.options.tp_group)
            if not s.name.startswith("embed.weight") or 0 in self.stages
        ]

    def load_slots(self) -> list[Slot]:
        return _owned_slots(self.params, self._owned, self.optimizer)

    def full_state_dict(self) -> dict:
        from ..fsdp import state_dict as fsdp_state

        mine = {}
        for s, stage in self.stages.items():
            if self.mesh.data_kind == "fsdp":
                local = fsdp_state.get(stage, "full_state_dict")
            else:
                local = {n: t.detach().clone() for n, t in stage.state_dict().items()}
            for n, t in local.items():
                global_name = self.global_names[s].get(n.removeprefix("body."))
                if global_name is not None:
                    if self.options.tp_group is not None:  # whole tensors from the tp shards
                        from .. import tensor_parallel as tp

                        info = self._tp_infos.get(global_name)
                        t = tp.full_tensor(t, info, self.options.tp_group)
                    mine[global_name] = t
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine if self.mesh.data_rank == 0 else {})
        merged = {k: v for part in gathered for k, v in part.items()}
        merged["head.weight"] = merged["embed.weight"]
        return merged
