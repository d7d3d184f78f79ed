"""The one train step of ``shardwise-train``, over any composition of the transforms in
``parallelize.py`` (tp × pipeline × checkpointing × DDP/FSDP/ZeRO):

1. forward and backward of every gradient-accumulation micro-batch: through the pipeline
   executor when the model is cut into stages, else through the (wrapped) model with gradient
   reduction held back until the last micro-batch; fp16 losses are multiplied by the scale;
2. the update: ZeRO's C++ optimizer (reduce, unscale, clip, step), or the fused AdamW after the
   C++ GradScaler's unscale (an overflow on any rank skips the step on every rank) and a clip by
   the global norm, which counts tp-replicated parameters and the tied head copy once;
3. the loss, the mean over the micro-batches and the data ranks (from the last stage).

``TrainStep`` also gives checkpoints what this rank owns (``save_slots`` / ``load_slots``, as
``pieces.Slot``s, so checkpoints are layout independent; ZeRO keeps its own C++ pieces) and the
full state dict of the plain GPT (``full_state_dict``, collective; whole on rank 0).
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from .. import _C
from ..optim import FusedAdamW, FusedLamb
from ..pieces import Slot
from . import deterministic
from .parallelize import Axes, Parallel, StrategyOptions, autocast_context, mesh_axes, parallelize


def build(strategy: str, options: StrategyOptions, world: int) -> TrainStep:
    """The mesh, the transforms and the step for ``strategy`` (ddp | fsdp | zero | pipeline)."""
    if strategy not in ("ddp", "fsdp", "zero", "pipeline"):
        raise ValueError(f"strategy {strategy!r}: use ddp, fsdp, zero or pipeline")
    axes = mesh_axes(strategy, options, world)
    pipeline = strategy == "pipeline"
    kind = axes.data_kind if pipeline else strategy
    return TrainStep(parallelize(options, axes, "ddp" if kind == "dp" else kind, pipeline))


def _optimizer(par: Parallel) -> FusedAdamW | FusedLamb:
    """The fused AdamW or LAMB (``training.optimizer``) with its moments created now (so a
    checkpoint can fill them). LAMB's trust ratio is a whole parameter's: each tensor is named
    by the parameter it is a piece of (``owned``), the sums added up over FSDP's shard group and,
    for tensor-parallel pieces, over the tp group."""
    options = par.options
    params = [p for p in par.params if p.requires_grad]
    hyper = {"lr": 0.0, "betas": options.betas, "weight_decay": options.weight_decay}
    if options.optimizer == "lamb":
        names = {id(p): par.owned[id(p)][0] for p in params}
        split = sorted({par.owned[id(p)][0] for p in params if par.owned[id(p)][3] is not None})
        sharded = par.kind == "fsdp"
        opt = FusedLamb(params, **hyper, names=names, tp_split=split, tp_group=par.axes.tp_group,
                        group=par.axes.data_group if sharded else None)  # fmt: skip
    else:
        opt = FusedAdamW(params, **hyper)
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


class TrainStep:
    """``step(batches, lr)``: one optimizer step over the micro-batches ``batches`` (a list of
    (inputs, targets)); returns the loss and the gradient norm before clipping (inf: an fp16
    overflow skipped the step)."""

    state_bytes = 0  # model_state_bytes() at the end of the last step, before zero_grad
    # wall seconds of the last step's phases on this rank: forward, backward (a pipeline:
    # forward_backward, its schedule interleaves them) and optimizer; host time on a GPU
    phase_seconds: dict = {}

    def __init__(self, parallel: Parallel):
        self.par, self.options = parallel, parallel.options
        self.engine = parallel.engine
        self.scaler = self.optimizer = None
        if self.engine is None:
            self.optimizer = _optimizer(parallel)
            if self.options.precision == "fp16":  # the overflow agreed over the whole world
                from .. import _C

                self.scaler = _C.GradScaler(
                    initial_scale=self.options.initial_loss_scale, group=dist.group.WORLD
                )
        elif self.options.precision == "fp16":
            self.scaler = self.engine.optimizer  # ZeRO's own loss scaler
        parallel.loss_scale = self.loss_scale

    @property
    def axes(self) -> Axes:
        return self.par.axes

    @property
    def data_group(self):
        return self.axes.data_group

    @property
    def mesh_description(self) -> str:
        return self.axes.description

    def loss_scale(self) -> float:
        if self.engine is not None:
            return float(self.engine.optimizer.loss_scale())
        return self.scaler.scale if self.scaler is not None else 1.0

    # --- the step --------------------------------------------------------------------------

    def train_step(self, batches, lr: float) -> dict:
        """One optimizer step at ``lr`` (a DeepSpeed ``scheduler`` in the ZeRO config overrides
        it: the returned ``lr`` is the one used)."""
        self.phase_seconds = {}
        mean = None
        if self.options.deterministic:  # the same bits at every data-parallel size
            start = time.perf_counter()
            total, mean = deterministic.forward_backward(
                self.par, batches, self.optimizer_step_count(), self.data_group
            )
            self.phase_seconds["forward_backward"] = time.perf_counter() - start
        else:
            total = self._forward_backward(batches)
        scheduler = getattr(self.engine, "lr_scheduler", None)
        if scheduler is not None:
            lr = self.engine.get_lr()[0]
        start = time.perf_counter()
        norm = self._update(lr, len(batches))
        self.phase_seconds["optimizer"] = time.perf_counter() - start
        if scheduler is not None and math.isfinite(norm):  # DeepSpeed: not after a skip
            scheduler.step()
        if self.par.pipe is not None:  # only the last stage's loss is nonzero
            loss = torch.tensor([total if self.par.is_last else 0.0], dtype=torch.float64)
            dist.all_reduce(loss, group=self.axes.pipeline_group)
            total = loss.item()
        if mean is None:
            mean = _mean_over(total, self.data_group)
        return {"loss": mean, "local_loss": total, "grad_norm": norm, "lr": lr}

    def eval_loss(self, batches) -> float:
        """The mean loss over ``batches`` (a list of (inputs, targets)) and the data ranks,
        without gradients and with dropout off; the same number on every rank."""
        par = self.par
        modules = [m for m in par.stages.values() if isinstance(m, torch.nn.Module)]
        modes = [m.training for m in modules]
        for m in modules:
            m.train(False)
        try:
            with torch.no_grad():
                if self.options.deterministic:  # an exact sum, the same at every size
                    return deterministic.eval_loss(par, batches, self.data_group)
                if par.pipe is not None:
                    total = sum(par.pipe.evaluate(x, y) for x, y in batches)
                    loss = torch.tensor([total if par.is_last else 0.0], dtype=torch.float64)
                    dist.all_reduce(loss, group=self.axes.pipeline_group)
                    total = loss.item()
                else:
                    total = 0.0
                    for x, y in batches:
                        with autocast_context(par.autocast, par.options.device):
                            total += par.gpt.cross_entropy(par.forward(x), y).item()
        finally:
            for m, mode in zip(modules, modes, strict=True):
                m.train(mode)
        return _mean_over(total / len(batches), self.data_group)

    def _forward_backward(self, batches) -> float:
        par, n, clock = self.par, len(batches), time.perf_counter
        if par.pipe is not None:
            start = clock()
            total = sum(par.pipe.step(x, y) for x, y in batches) / n / self.loss_scale()
            self.phase_seconds["forward_backward"] = clock() - start
            return total
        total, syncs = 0.0, sync_points(n, self.options.sync_every)
        forward = backward = 0.0
        for k, (x, y) in enumerate(batches):
            # the backward must run inside no_sync too, or every micro-batch reduces
            with par.no_sync(k in syncs):
                start = clock()
                with autocast_context(par.autocast, par.options.device):
                    loss = par.gpt.cross_entropy(par.forward(x), y) / n
                middle = clock()
                (loss * self.loss_scale()).backward()
                forward, backward = forward + middle - start, backward + clock() - middle
            total += loss.item()
        self.phase_seconds.update(forward=forward, backward=backward)
        return total

    def _update(self, lr: float, micro_batches: int) -> float:
        if self.engine is not None:
            self.engine.set_lr(lr)
            self.state_bytes = self.model_state_bytes()  # the peak: before the step frees grads
            stepped = self.engine.optimizer.step()
            return float(self.engine.optimizer.last_grad_norm()) if stepped else math.inf
        params = [p for p in self.par.params if p.grad is not None]
        if self.par.pipe is not None and micro_batches > 1 and not self.options.deterministic:
            # the executor sums them (the deterministic pipeline divides by the global count)
            torch._foreach_div_([p.grad for p in params], micro_batches)
        if self.scaler is not None and self.scaler.update(
            self.scaler.unscale_([p.grad for p in params])
        ):
            return self._finish(math.inf)
        norm = self.clip_grad_norm_(params, self.options.clip)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        return self._finish(norm)

    def _finish(self, norm: float) -> float:
        self.state_bytes = self.model_state_bytes()  # the peak: gradients are still there
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def clip_grad_norm_(self, params: list[torch.Tensor], max_norm: float | None) -> float:
        """The global norm (C++ ``training::clip_grad_norm_over_mesh``): split parameters
        summed over tp, shards over the fsdp axis, stages over the pp axis; replicated
        parameters count once and the head's copy of a tied embedding not at all (it is scaled
        with the rest). Gradients scaled if above ``max_norm``."""
        par, axes = self.par, self.axes
        if par.kind == "fsdp" and par.pipe is None and axes.tp_group is None:
            return float(par.forward.clip_grad_norm_(max_norm or math.inf))  # FSDP's own layout
        if self.options.deterministic and axes.tp_group is None:
            if par.pipe is not None:  # the exact norm over the stages, the head's copy once
                return par.pipe.clip_grad_norm_(max_norm or math.inf)
            return deterministic.clip_grad_norm_(params, max_norm)
        held, split = [p for p in params if p.grad is not None], par.split
        counted = [p for p in held if id(p) != par.head_copy]
        return _C.clip_grad_norm_over_mesh(
            [p.grad for p in counted if id(p) in split],
            [p.grad for p in counted if id(p) not in split],
            [p.grad for p in held if id(p) == par.head_copy],
            max_norm or 0.0,
            axes.tp_group,
            axes.data_group if par.kind == "fsdp" else None,
            axes.pipeline_group if par.pipe is not None else None,
        )

    # --- state ---------------------------------------------------------------------------

    def optimizer_step_count(self) -> int:
        if self.engine is not None:
            return int(self.engine.optimizer.step_count())
        return max((int(s["step"]) for s in self.optimizer.state.values()), default=0)

    def set_optimizer_step_count(self, step: int) -> None:
        for state in self.optimizer.state.values():
            state["step"] = int(step)

    def model_state_bytes(self) -> int:
        """Bytes this rank holds now for parameters, gradients and optimizer state (tensor
        storages, each counted once), to compare with the planner's estimate."""
        if self.engine is not None:
            return sum(self.engine.memory_bytes().values())
        tensors = [*self.par.params, *(t.grad for t in self.par.params if t.grad is not None)]
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

    def scaler_state(self) -> dict | None:
        """fp16 outside ZeRO: the GradScaler's state (the same on every rank: the overflow is
        agreed over the world), so a resumed run goes on with the scale it had."""
        return self.scaler.state() if self.engine is None and self.scaler is not None else None

    def load_scaler_state(self, state: dict | None) -> None:
        if self.engine is None and self.scaler is not None and state is not None:
            self.scaler.load_state(state)

    def save_slots(self) -> list[Slot]:
        """What this rank writes (C++ ``training/checkpoint_writer.h``, the rule the LibTorch
        trainer follows too): of the ranks holding equal copies, the first along each axis they
        are replicated over (dp; tp unless tp-split; pp for the pipeline's tied embedding)."""
        mesh = self.axes.mesh
        tied = set(self.par.aliases.values()) if self.par.pipe is not None else set()
        return [
            s
            for s in self.load_slots()
            if _C.checkpoint_writes(
                mesh.layout, mesh.rank, s.tp_split, s.name.split(":")[0] in tied
            )
        ]

    def load_slots(self) -> list[Slot]:
        """Views of every parameter and AdamW moment this rank holds."""
        return owned_slots(self.par.params, self.par.owned, self.optimizer)

    def replicated_slots(self) -> list[Slot]:
        """Every slice this rank holds, keyed as checkpoints key them, so that copies on other
        ranks share the key (``consistency.py``): the parameters and AdamW moments (FSDP's
        shards among them, at their own places); under ZeRO 0-2 the module's parameters, tp
        shards tagged with their tp rank; ZeRO-3 holds its own shards only: none."""
        if self.engine is None:
            return self.load_slots()
        if self.engine.stage == 3:
            return []
        from ..tensor_parallel import tp_info

        tp = self.axes.tp_group
        slots = []
        for name, p in self.engine.module.named_parameters():
            split = tp is not None and tp_info(p) is not None
            key = f"{name}@tp{dist.get_rank(tp)}" if split else name
            slots.append(Slot(key, 0, p.detach().reshape(-1)))
        return slots

    def payload(self) -> dict:
        """ZeRO: its C++ pieces, tagged with the tp coordinate (they are pieces of tp shards)."""
        tp = self.axes.tp_group
        tp_at = (dist.get_rank(tp), dist.get_world_size(tp)) if tp is not None else (0, 1)
        return {**self.engine.optimizer_state(), "tp": tp_at}

    def load_payloads(self, payloads: list[dict]) -> None:
        """ZeRO: the pieces of every saving rank with this rank's tp coordinate (any data size);
        a different tp size is refused (ZeRO's pieces are of tp shards)."""
        tp = self.axes.tp_group
        rank, size = (dist.get_rank(tp), dist.get_world_size(tp)) if tp is not None else (0, 1)
        saved = payloads[0].get("tp", (0, 1))[1]
        if saved != size:
            raise ValueError(
                f"a ZeRO checkpoint saved with tensor-parallel size {saved} cannot resume at tp "
                f"size {size}: ZeRO's pieces are of tp shards; resume with tp={saved}"
            )
        self.engine.load_optimizer_states(
            [p for p in payloads if tuple(p.get("tp", (0, 1)))[0] == rank]
        )

    def full_state_dict(self) -> dict:
        """The plain GPT's parameters as whole tensors on rank 0 ({} elsewhere; collective):
        FSDP shards gathered by the engine, tp shards over the tp axis, the stages brought to
        stage 0 over the pp axis, from the first data replica (C++
        ``training::gather_full_state``)."""
        from .. import tensor_parallel as tp

        par, local = self.par, self._local_state()
        if par.pipelined:  # every stage's names, as every rank knows the cut
            stages = [
                [(n, par.gpt.full_shapes[n], torch.float32) for n in s] for s in par.stage_names
            ]
        else:
            stages = [
                [(n, par.gpt.full_shapes.get(n, t.shape), t.dtype) for n, t in local[0].items()]
            ]
        stages = [
            [(*p, local.get(s, {}).get(p[0])) for p in names] for s, names in enumerate(stages)
        ]
        infos = {n: tp.tp_info(p) for n, p in par.gpt.named_parameters(remove_duplicate=False)}
        group = self.axes.tp_group
        full = dict(
            _C.gather_full_state(
                self.axes.mesh.layout, dist.get_rank(), stages, self.axes.pipeline_group,
                lambda name, value: tp.full_tensor(value, infos.get(name), group),
            )
        )  # fmt: skip
        for alias, name in par.aliases.items() if full else ():  # a tied head, as the embedding
            full[alias] = full[name]
        return full

    def _local_state(self) -> dict[int, dict[str, torch.Tensor]]:
        """This rank's stages' parameters by full name (FSDP's gathered whole over its data
        axis; tp shards as they are), stage by stage."""
        from ..fsdp import state_dict as fsdp_state

        par, local = self.par, {}
        wrapped = {0: par.engine.module} if par.engine is not None else par.stages
        for s, stage in wrapped.items():
            if hasattr(stage, "_engine"):  # FSDP (also ZeRO-3's)
                state = fsdp_state.get(stage, "full_state_dict")
            else:
                state = {n: t.detach() for n, t in stage.state_dict().items()}
            local[s] = {}
            for n, t in state.items():
                name = n.removeprefix("module.")
                if par.pipelined:
                    name = par.global_names[s].get(name.removeprefix("body."))
                if name is not None:
                    local[s][name] = t.float() if par.engine is not None else t
        return local


def sync_points(micro_batches: int, every: int | None) -> set[int]:
    """The micro-batches after which the gradients are reduced: every ``every``-th
    (``training.sync_gradients_every``) and always the last."""
    every = every or micro_batches
    return {k for k in range(micro_batches) if (k + 1) % every == 0} | {micro_batches - 1}


def owned_slots(params, owned: dict, optimizer) -> list[Slot]:
    """Slots of parameters and their AdamW moments: owned[id(p)] = (name, start, valid, runs):
    ``p`` holds elements [start, start + valid) of the parameter, or, with tensor-parallel
    ``runs``, of this rank's shard, which the runs place in the full parameter (one slot per
    run it overlaps)."""
    slots = []
    for p in params:
        if id(p) not in owned:
            continue
        name, start, valid, runs = owned[id(p)]
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
