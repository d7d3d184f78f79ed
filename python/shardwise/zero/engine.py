"""``shardwise.zero.initialize``: a DeepSpeed-style engine around the C++ ZeRO optimizer
(``csrc/zero/``). It only adapts: casts the model for bf16/fp16, scales the loss, counts
micro-steps, and saves/loads the optimizer's world-size-independent pieces."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .. import _C
from ..fsdp import FullyShardedDataParallel, auto_wrap
from . import config as zero_config
from . import ds_checkpoint
from .deepspeed_keys import auto_from_hidden_size


class ZeroEngine(nn.Module):
    """The model plus its ZeRO optimizer. Use ``engine(batch)``, ``engine.backward(loss)``,
    ``engine.step()`` (steps only at the accumulation boundary) like DeepSpeed's engine."""

    def __init__(
        self,
        model: nn.Module,
        config: Mapping | str | Path,
        process_group=None,
        tp_group=None,
        auto: Mapping | None = None,
        client_optimizer: torch.optim.Optimizer | None = None,
        client_scheduler=None,
        deterministic: bool = False,
    ):
        """``process_group``: the data-parallel ranks (default: the world). ``tp_group``: the
        tensor-parallel ranks of a model ``tensor_parallel.parallelize`` has cut; the gradient
        norm and the fp16 overflow flag then account for it (``csrc/zero/zero_optimizer.h``).
        ``auto``: the values DeepSpeed's ``"auto"`` entries take (``config.load``); the bucket
        sizes default to Hugging Face's rule from the model's ``config.hidden_size``.
        ``client_optimizer``: DeepSpeed's client optimizer, whose hyperparameters the config's
        optimizer section holds (``client_optimizer.py``); the engine follows its ``lr`` (read
        before each step, written by ``set_lr``). ``client_scheduler``: a scheduler on it
        (DeepSpeed's ``lr_scheduler=``), stepped after every applied step. ``deterministic``:
        the same bits at every data-parallel size (docs/deterministic.md): every stage reduces
        each micro-batch by the tree, gradients are summed (``backward`` divides the loss by
        the global micro-batch count), the clip norm is summed exactly."""
        super().__init__()
        self.client_optimizer = client_optimizer
        self.tp_group = tp_group
        group = process_group or (dist.group.WORLD if dist.is_initialized() else None)
        world = dist.get_world_size(group) if group is not None else 1
        hidden = getattr(getattr(model, "config", None), "hidden_size", None)
        filled = auto_from_hidden_size(hidden) if isinstance(hidden, int) else {}
        self.config = zero_config.load(config, world, {**filled, **(auto or {})})
        native = self.config["native"]
        if deterministic:
            if native["gradient_predivide_factor"] != 1.0:  # prescale_gradients gives 0
                raise zero_config.ConfigError(
                    "gradient_predivide_factor / prescale_gradients with deterministic=True: "
                    "the deterministic mode sums the gradients (nothing is divided; the loss "
                    "is divided by the global micro-batch count); leave them out"
                )
            zero = self.config["zero_optimization"]
            quantized = [
                k for k in ("zero_quantized_weights", "zero_quantized_gradients") if zero[k]
            ]
            if quantized:
                raise zero_config.ConfigError(
                    f"{' and '.join(quantized)} with deterministic=True: the quantization blocks "
                    "follow the shard size, so the bits would change with the data-parallel "
                    "size; leave out one or the other"
                )
            native["deterministic"] = True
        self.deterministic = deterministic
        self.stage = native["stage"]
        self.accumulation = self.config["gradient_accumulation_steps"]
        self.dtype = (
            torch.bfloat16
            if self.config["bf16"]["enabled"]
            else torch.float16
            if self.config["fp16"]["enabled"]
            else torch.float32
        )
        self.micro_steps = 0
        self._applied = False
        self._boundary = None  # set_gradient_accumulation_boundary's override
        self.overflow = False  # the last boundary's step was skipped (fp16 inf/nan)
        if self.stage == 3:
            self.module = self._shard(model, group)
        else:
            self.module = model.to(self.dtype)
            params = [p for p in model.parameters() if p.requires_grad]
            self.optimizer = _C.ZeroOptimizer(params, native, group, **self._tp(params))
        schedule = self.config["schedule"]
        self.lr_scheduler = WarmupScheduler(self, schedule) if schedule else client_scheduler

    def _shard(self, model: nn.Module, group) -> nn.Module:
        ids = {id(p): i for i, p in enumerate(model.parameters())}
        tp = self._tp(list(model.parameters()))
        mixed = self.dtype != torch.float32
        zero = self.config["zero_optimization"]
        native = self.config["native"]
        fsdp = FullyShardedDataParallel(
            model,
            param_dtype=self.dtype if mixed else None,
            reduce_dtype=torch.float32 if mixed else None,
            wrap=auto_wrap.transformer_blocks(model, ()),
            forward_prefetch=zero["stage3_prefetch_bucket_size"] > 0,
            # stage 3 offloads the shards themselves (offload_param, or offload_optimizer: the
            # optimizer steps the shards where they live)
            cpu_offload=native["offload_optimizer"] or native["offload_param"],
            pin_memory=native["pin_memory"],
            process_group=group,
            # ZeRO++'s hpZ: after forward each block keeps a secondary partition over groups of
            # this many consecutive ranks, and backward all-gathers within them
            post_forward_shard_size=zero["zero_hpz_partition_size"]
            if zero["zero_hpz_partition_size"] > 1
            else None,
            # ZeRO++'s qwZ: the parameters all-gathered as int8 with block scales
            quantized_all_gather=zero["zero_quantized_weights"],
            # ZeRO++'s qgZ: the gradients reduce-scattered as int8 blocks (an all-to-all)
            quantized_reduce_scatter=zero["zero_quantized_gradients"],
            deterministic=self.deterministic,
        )
        shards, pieces = [], []
        for owned in fsdp.owned_slices():
            if owned.parameter.requires_grad:
                pieces.append((ids[id(owned.parameter)], owned.start, owned.valid, owned.numel))
                shards.append(owned.parameter)
        self.optimizer = _C.ZeroOptimizer.local(
            shards,
            pieces,
            {**native, "offload_optimizer": False},
            group,
            **tp,
        )
        return fsdp

    def _tp(self, params: list[torch.Tensor]) -> dict:
        """The optimizer's tensor-parallel arguments: the group and, per parameter id, whether
        it is split over it (``tensor_parallel.tp_info``)."""
        if self.tp_group is None or dist.get_world_size(self.tp_group) == 1:
            return {}
        from ..tensor_parallel import tp_info

        return {"tp_group": self.tp_group, "tp_split": [tp_info(p) is not None for p in params]}

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss`` times the fp16 loss scale / gradient_accumulation_steps."""
        if self.deterministic:  # summed over the ranks: the global micro-batch count
            micro_batches = self.train_batch_size() // self.train_micro_batch_size_per_gpu()
            (loss * self.optimizer.loss_scale() / micro_batches).backward()
        else:
            (loss * (self.optimizer.loss_scale() / self.accumulation)).backward()
        self.micro_steps += 1

    def is_gradient_accumulation_boundary(self) -> bool:
        """Every ``gradient_accumulation_steps``-th micro-step, unless
        ``set_gradient_accumulation_boundary`` said otherwise."""
        if self._boundary is not None:
            return self._boundary
        return self.micro_steps % self.accumulation == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """DeepSpeed's: the caller (Accelerate's ``accumulate``) decides which micro-step ends
        the accumulation; the count decides again after ``None``."""
        self._boundary = is_boundary

    @contextlib.contextmanager
    def no_sync(self):
        """DeepSpeed's ``no_sync`` for stages 0 and 1: nothing to defer, as their gradients are
        reduced at the accumulation boundary (``step``) only. Stages 2 and 3 reduce during
        backward and refuse it, as DeepSpeed does."""
        if self.stage >= 2:
            raise RuntimeError(
                f"no_sync is incompatible with ZeRO stage {self.stage}, whose gradients are "
                "partitioned during backward (DeepSpeed's rule); accumulate without it"
            )
        yield

    def step(self) -> bool:
        """At the accumulation boundary: reduce, unscale, clip and step (False: an fp16 overflow
        skipped it on every rank). Between boundaries: nothing."""
        self._applied = False
        if not self.is_gradient_accumulation_boundary():
            return False
        if self.client_optimizer is not None:  # a torch scheduler may have moved its lr
            self.set_lr(self.get_lr()[0])
        stepped = self._applied = self.optimizer.step()
        self.overflow = not stepped
        if stepped and self.client_optimizer is not None:
            # what torch's wrapped optimizer.step records for its schedulers: the engine stepped
            # in the client optimizer's place (else a scheduler on it warns of a missed step)
            self.client_optimizer._opt_called = True
        if stepped and self.lr_scheduler is not None:  # DeepSpeed: not after a skipped step
            self.lr_scheduler.step()
        return stepped

    def set_lr(self, lr: float) -> None:
        self._lr = float(lr)
        self.optimizer.set_lr(self._lr)
        for group in self.client_optimizer.param_groups if self.client_optimizer else ():
            group["lr"] = self._lr

    def get_lr(self) -> list[float]:
        """The learning rate the next step uses (DeepSpeed's ``engine.get_lr()``): the client
        optimizer's, when there is one."""
        if self.client_optimizer is not None:
            return [float(self.client_optimizer.param_groups[0]["lr"])]
        return [getattr(self, "_lr", self.config["native"]["optimizer"]["lr"])]

    @property
    def global_steps(self) -> int:
        return self.optimizer.step_count()

    @property
    def loss_scale(self) -> float:
        return self.optimizer.loss_scale()

    def memory_bytes(self) -> dict[str, int]:
        """Bytes now held per rank by parameters, gradients and optimizer state (storages)."""
        if self.stage == 3:
            fsdp = self.module.memory_bytes()
            params, grads = fsdp["parameters"], fsdp["gradients"]
        else:
            params = sum(p.untyped_storage().nbytes() for p in self.module.parameters())
            grads = sum(
                p.grad.untyped_storage().nbytes()
                for p in self.module.parameters()
                if p.grad is not None
            )
            grads += self.optimizer.grad_partition_bytes()
        return {
            "parameters": params,
            "gradients": grads,
            "optimizer": self.optimizer.master_bytes() + self.optimizer.state_bytes(),
        }

    # --- checkpoints ---------------------------------------------------------------------

    def optimizer_state(self) -> dict:
        """This rank's optimizer state as world-size-independent pieces."""
        return {
            "pieces": self.optimizer.state_pieces(),
            "step": self.optimizer.step_count(),
            "scaler": self.optimizer.scaler_state(),
            "micro_steps": self.micro_steps,
            "lr": self.get_lr()[0],
            "scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None,
        }

    def load_optimizer_states(self, states: list[dict], scheduler: bool = True) -> None:
        """Loads the states every rank of a run saved (any world size); the scheduler's too
        unless ``scheduler`` is False."""
        pieces = [piece for state in states for piece in state["pieces"]]
        self.optimizer.load_state_pieces(pieces, int(states[0]["step"]))
        if states[0]["scaler"] is not None:
            self.optimizer.set_scaler_state(states[0]["scaler"])
        self.micro_steps = int(states[0]["micro_steps"])
        if "lr" in states[0]:  # as DeepSpeed's optimizer state carries its groups' lr
            self.set_lr(float(states[0]["lr"]))
        if scheduler and self.lr_scheduler is not None and states[0].get("scheduler") is not None:
            self.lr_scheduler.load_state_dict(states[0]["scheduler"])

    def save_optimizer_checkpoint(self, directory: str | Path) -> None:
        """Each rank writes its pieces to ``directory/zero_rank{r}.pt`` atomically (a temporary
        ``.zero_rank{r}.pt.<x>.tmp``, removed if the write fails; one a killed write left is
        what ``shardwise.train.checkpoint.remove_temporary_files`` deletes)."""
        from ..atomic_file import atomic_write

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        rank = dist.get_rank() if dist.is_initialized() else 0
        state = self.optimizer_state()
        atomic_write(directory / f"zero_rank{rank}.pt", lambda f: torch.save(state, f))

    def load_optimizer_checkpoint(self, directory: str | Path, scheduler: bool = True) -> None:
        """Loads the pieces every saving rank wrote (any number of them)."""
        files = sorted(Path(directory).glob("zero_rank*.pt"))
        if not files:
            raise FileNotFoundError(f"no zero_rank*.pt files in {directory}")
        self.load_optimizer_states([torch.load(f, weights_only=True) for f in files], scheduler)

    # --- DeepSpeed's engine surface (deepspeed.runtime.engine.DeepSpeedEngine) --------------

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (the launcher's LOCAL_RANK), as DeepSpeed reads it."""
        return int(os.environ.get("LOCAL_RANK", 0))

    @property
    def global_rank(self) -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else 1

    def train_batch_size(self) -> int:
        return self.config["train_batch_size"]

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config["train_micro_batch_size_per_gpu"]

    def gradient_accumulation_steps(self) -> int:
        return self.accumulation

    def zero_optimization_stage(self) -> int:
        return self.stage

    def fp16_enabled(self) -> bool:
        return self.dtype == torch.float16

    def bf16_enabled(self) -> bool:
        return self.dtype == torch.bfloat16

    def bfloat16_enabled(self) -> bool:  # DeepSpeed has both names
        return self.bf16_enabled()

    def was_step_applied(self) -> bool:
        """Whether the last ``step()`` updated the parameters (False between accumulation
        boundaries and after an fp16 overflow)."""
        return self._applied

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm of the last applied step (before clipping); None before one, and
        None without ``gradient_clipping`` (only clipping computes it here, where DeepSpeed
        computes it every step)."""
        clipping = self.config["native"].get("gradient_clipping", 0) > 0
        return self.optimizer.last_grad_norm() if self.global_steps > 0 and clipping else None

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True) -> bool:
        """DeepSpeed's: every rank calls it; ``save_dir/<tag>/`` and ``save_dir/latest``
        (``ds_checkpoint.py``)."""
        ds_checkpoint.save_checkpoint(self, save_dir, tag, client_state, save_latest)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False):  # fmt: skip
        """DeepSpeed's: (the path loaded, client_state), or (None, None) without ``latest``."""
        return ds_checkpoint.load_checkpoint(self, load_dir, tag, load_module_strict,
                                             load_optimizer_states, load_lr_scheduler_states,
                                             load_module_only)  # fmt: skip


class WarmupScheduler:
    """DeepSpeed's scheduler interface (``step``, ``get_lr``, ``get_last_lr``, ``state_dict``)
    over the C++ schedule (``csrc/optim/warmup_schedule.h``); it sets the engine's lr as
    DeepSpeed's does its optimizer's: at construction only when ``last_batch_iteration`` is -1
    (a schedule started later leaves the optimizer's lr for the first step, as DeepSpeed's
    does) and after every optimizer step that was not skipped."""

    def __init__(self, engine: ZeroEngine, options: Mapping):
        self._engine = engine
        self._schedule = _C.WarmupSchedule(dict(options))
        self.last_batch_iteration = int(options.get("last_batch_iteration", -1))
        if self.last_batch_iteration == -1:
            self._apply()

    def get_lr(self) -> list[float]:
        return [self._schedule.lr(self.last_batch_iteration)]

    def get_last_lr(self) -> list[float]:
        return self._engine.get_lr()

    def step(self, last_batch_iteration: int | None = None) -> None:
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = last_batch_iteration
        self._apply()

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: Mapping) -> None:
        self.last_batch_iteration = int(state["last_batch_iteration"])
        self._apply()

    def _apply(self) -> None:
        self._engine.set_lr(self.get_lr()[0])


def initialize(
    model: nn.Module,
    config: Mapping | str | Path,
    process_group=None,
    tp_group=None,
    auto: Mapping | None = None,
) -> ZeroEngine:
    """Wraps ``model`` for ZeRO as ``config`` (DeepSpeed keys, a mapping or a JSON file) says;
    with ``tp_group``, over the data axis of a tensor-parallel model. For DeepSpeed's own
    signature and 4-tuple, see ``shardwise.deepspeed.initialize``."""
    return ZeroEngine(model, config, process_group, tp_group, auto)
