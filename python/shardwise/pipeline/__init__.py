"""Pipeline parallelism (C++: ``csrc/pipeline/``): schedules generated and validated in C++, and
the C++ executor running this rank's stages. This module cuts a batch into microbatches and
hands nn.Modules and a loss function to the C++ ``Pipeline`` (which also averages replicated
stages and sums tied parameters' gradients); it also holds what only Python models need: the GPT
as a chain of blocks (``hf_stages``: a Hugging Face model's), the timing for the cut by measured
time, and ZB-H1's deferred weight gradients on nn.Linear layers."""

from __future__ import annotations

import copy as _copy
import types
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .. import _C

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")


def make_schedule(kind: str, num_ranks: int, num_microbatches: int, virtual_stages: int = 1):
    """The schedule (per rank, its ordered actions), already validated by simulation."""
    return _C.make_pipeline_schedule(kind, num_ranks, num_microbatches, virtual_stages)


def validate(
    schedule,
    forward: float = 1.0,
    backward: float = 2.0,
    buffered_sends: bool = True,
    stage_forward: Sequence[float] = (),
    stage_backward: Sequence[float] = (),
):
    """Simulates every rank: ok/error, makespan, bubble fraction, peak stashed microbatches.
    Every stage costs ``forward`` and ``backward``, or, given one entry per stage,
    ``stage_forward[k]`` and ``stage_backward[k]``."""
    return _C.validate_pipeline_schedule(
        schedule, forward, backward, buffered_sends, list(stage_forward), list(stage_backward)
    )


def _deferred_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return _C.deferred_linear(x, self.weight, self.bias)


def defer_weight_gradients(module: nn.Module) -> nn.Module:
    """Makes every ``nn.Linear`` in ``module`` compute through the C++ ``deferred_linear``, whose
    weight gradients a zero-bubble schedule (``zb_h1``) computes in its W actions instead of in
    the backward that the previous stage waits for. Outside such a schedule the layers compute
    exactly what ``nn.Linear`` computes. Returns ``module`` (changed in place)."""
    for sub in module.modules():
        if type(sub) is nn.Linear:
            sub.forward = types.MethodType(_deferred_linear_forward, sub)
    return module


def _blocks(blocks: Sequence[nn.Module]) -> tuple[list, list[list[torch.Tensor]]]:
    return list(blocks), [list(b.parameters()) for b in blocks]


def split_by_parameters(blocks: Sequence[nn.Module], num_stages: int) -> list[list[int]]:
    """Contiguous groups of block indices, one per stage, whose largest parameter count is as
    small as possible (C++ split_by_parameters)."""
    starts = _C.pipeline_split_by_parameters(_blocks(blocks)[1], num_stages)
    return _C.pipeline_stage_groups(starts, len(blocks))


def split_by_time(
    blocks: Sequence[nn.Module],
    num_stages: int,
    sample: torch.Tensor,
    repeats: int = 3,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    target: torch.Tensor | None = None,
    refine: bool = True,
) -> list[list[int]]:
    """Like split_by_parameters, balancing measured forward + backward time on ``sample`` (fed
    through the blocks in order; C++ split_by_time). The cut balances the blocks' own times;
    with ``refine``, each boundary is then moved by one block while that lowers the slowest
    stage timed as a whole by 1% (a stage is not the sum of its blocks: caches, casts and its
    output conversion). With ``loss_fn``, the last block is timed with ``loss_fn(output,
    target)`` as the pipeline's last stage runs it. Runs under the caller's autocast, if any.
    Timing differs between processes: split on one rank and broadcast the groups
    (``broadcast_groups``)."""
    forwards, parameters = _blocks(blocks)
    starts = _C.pipeline_split_by_time(
        forwards, parameters, num_stages, sample, repeats, loss_fn, target, refine
    )
    return _C.pipeline_stage_groups(starts, len(blocks))


def broadcast_groups(groups: list[list[int]], src: int = 0, group=None) -> list[list[int]]:
    """Rank ``src``'s stage groups on every rank of ``group`` (timing-based splits differ)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return groups
    box = [groups]
    dist.broadcast_object_list(
        box, src=dist.get_global_rank(group, src) if group else src, group=group
    )
    return box[0]


def block_times(
    blocks: Sequence[nn.Module],
    sample: torch.Tensor,
    repeats: int = 3,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    target: torch.Tensor | None = None,
) -> list[float]:
    """Each block's forward + backward seconds on ``sample`` fed through the blocks in order
    (the fastest of ``repeats`` after one warm-up); the input of each block is a fresh leaf."""
    return group_times(blocks, [[i] for i in range(len(blocks))], sample, repeats, loss_fn, target)


def group_times(
    blocks: Sequence[nn.Module],
    groups: list[list[int]],
    sample: torch.Tensor,
    repeats: int = 3,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    target: torch.Tensor | None = None,
) -> list[float]:
    """Forward + backward seconds of each group of consecutive blocks run as one stage (C++
    group_times: the fastest of ``repeats`` after one warm-up); a group's input is the previous
    group's output as a fresh leaf, the last group ends in ``loss_fn`` if given."""
    forwards, parameters = _blocks(blocks)
    return _C.pipeline_group_times(forwards, parameters, groups, sample, repeats, loss_fn, target)


def stage_modules(blocks: Sequence[nn.Module], groups: list[list[int]]) -> list[nn.Sequential]:
    """One nn.Sequential per stage from the groups of block indices."""
    return [nn.Sequential(*(blocks[i] for i in group)) for group in groups]


class _Call(nn.Module):
    """One method of a module as a block (e.g. a transformer block's attention half)."""

    def __init__(self, module: nn.Module, method: str, keep: Sequence[str]):
        super().__init__()
        self.method = method
        self.parts = nn.ModuleDict({name: getattr(module, name) for name in keep})
        self._fn = getattr(module, method)

    def forward(self, x):
        return self._fn(x)


class Head(nn.Module):
    """The last block: the final norm, then the output head; ``copy``: the head gets its own
    copy of the weight (tied to the embedding, which the first stage holds; the Pipeline sums
    the two gradients), keeping a tensor-parallel style's forward and shard."""

    def __init__(self, norm: nn.Module, head: nn.Module, copy: bool = False):
        super().__init__()
        self.norm, self.head = norm, head
        if not copy:
            return
        self.head = _copy.copy(head)
        self.head._parameters = dict(head._parameters)
        weight = nn.Parameter(head.weight.detach().clone())
        if hasattr(head.weight, "tp_shard"):  # a tensor-parallel shard stays one
            weight.tp_shard = head.weight.tp_shard
        self.head.weight = weight
        if "forward" in head.__dict__:  # a style's forward, bound to the original module
            self.head.forward = types.MethodType(head.forward.__func__, self.head)

    def forward(self, x):
        return self.head(self.norm(x))


def gpt_blocks(model, sublayers: bool = False) -> tuple[list[nn.Module], tuple[str, str] | None]:
    """The bundled GPT as a list of blocks (embedding, transformer blocks, norm + head) and, when
    the head is tied to the embedding, the names (in the first and last block) to keep tied: the
    last block gets its own copy, Pipeline(tied=...) sums their gradients. ``sublayers=True``
    lists each transformer block as its attention and its MLP half (finer cuts, better balance)."""

    class Embedding(nn.Module):
        def __init__(self, embed, pos):
            super().__init__()
            self.embed, self.pos = embed, pos

        def forward(self, tokens):
            return self.embed(tokens) + self.pos(
                torch.arange(tokens.shape[1], device=tokens.device)
            )

    tied = model.head.weight is model.embed.weight
    middle = list(model.blocks)
    if sublayers:
        middle = [
            half
            for b in model.blocks
            for half in (
                _Call(b, "attention", ("norm1", "qkv", "proj")),
                _Call(b, "mlp", ("norm2", "up", "down")),
            )
        ]
    blocks = [Embedding(model.embed, model.pos), *middle, Head(model.norm, model.head, copy=True)]
    return blocks, (("embed.weight", "head.weight") if tied else None)


class Pipeline:
    """Runs ``stages`` (this rank's stage modules, keyed by stage index) under a schedule: the C++
    ``pipeline::Pipeline`` (``csrc/pipeline/pipeline.h``), which also keeps ``tied`` parameters
    equal and averages replicated stages over ``data_parallel_group``.

    A stage is an nn.Module or any callable of one tensor (with no parameters to tie or average).
    ``loss_fn(output, target)`` is applied on the last stage per microbatch; ``step(inputs,
    targets)`` cuts both into the schedule's microbatches and returns the mean loss (on the
    rank of the last stage; 0 elsewhere). Gradients accumulate into the stage modules' ``.grad``.
    ``tied``: (stage a, name in stage a, stage b, name in stage b); stage b starts from stage a's
    values and after every step both gradients are their sum. FSDP-sharded stages
    (``shardwise.FullyShardedDataParallel``) reduce their own gradients in their last backward.

    ``deterministic``: the same bits at every pipeline and data-parallel degree (C++
    ``PipelineOptions::deterministic``): each microbatch's loss divided by the global batch's
    microbatch count (``num_microbatches`` × data-parallel size × ``accumulation``, the number
    of ``step`` calls per optimizer step, whose gradients the caller sums by the tree over the
    call index), the microbatches' gradients summed as the tree over their index, the replicas'
    by the tree all-reduce; ``last["losses"]`` holds each microbatch's loss.
    ``before_forward(stage, microbatch)``: called right before each stage forward (to seed a
    microbatch's randomness).
    """

    def __init__(
        self,
        stages: dict[int, nn.Module],
        schedule,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        group: dist.ProcessGroup | None = None,
        rank: int | None = None,
        data_parallel_group: dist.ProcessGroup | None = None,
        tied: Sequence[tuple[int, str, int, str]] = (),
        deterministic: bool = False,
        accumulation: int = 1,
        before_forward: Callable[[int, int], None] | None = None,
    ):
        if group is None and schedule.num_ranks > 1:
            group = dist.group.WORLD
        self.rank = rank if rank is not None else (dist.get_rank(group) if group else 0)
        self.schedule = schedule
        self.stages = stages
        self.data_parallel_group = data_parallel_group
        self.tied = list(tied)
        self._group = group
        ids = sorted(stages)
        self._pipeline = _C.Pipeline(
            ids,
            [stages[i] for i in ids],
            [_named_parameters(stages[i]) for i in ids],
            [_gradient_sync(stages[i]) for i in ids],
            schedule,
            self.rank,
            group,
            data_parallel_group,
            self.tied,
            loss_fn,
            deterministic,
            accumulation,
            before_forward,
        )
        self.last = None

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float:
        self.last = self._pipeline.step(inputs, targets)
        return self.last["loss"]

    def evaluate(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float:
        """The mean loss of a batch placed as for ``step``, without gradients (the schedule's
        forwards only; nothing is accumulated). On the last stage's rank; 0.0 elsewhere."""
        return self._pipeline.evaluate(inputs, targets)

    def evaluate_losses(self, inputs: torch.Tensor | None, targets: torch.Tensor | None):
        """As ``evaluate``, each microbatch's loss (on the last stage's rank; [] elsewhere)."""
        return self._pipeline.evaluate_losses(inputs, targets)

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clips this pipeline's gradients to ``max_norm`` as torch.nn.utils.clip_grad_norm_
        clips the unpipelined model's (the 2-norm over every stage, a tied pair counted once;
        a collective over the pipeline group). Call after ``step``. Returns the norm."""
        return self._pipeline.clip_grad_norm_(max_norm)

    def gather_times(self):
        """(actions, times) of every pipeline rank for the last step (a collective over the
        pipeline group), for timeline.render_text / timeline.plot."""
        mine = (self.schedule.actions(self.rank), self.last["times"])
        group = self._group
        if group is None:
            return [mine[0]], [mine[1]]
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, mine, group=group)
        return [g[0] for g in gathered], [g[1] for g in gathered]


def _named_parameters(stage) -> list[tuple[str, torch.Tensor]]:
    """A module stage's parameters by name; a plain callable stage has none to tie or average."""
    return list(stage.named_parameters()) if isinstance(stage, nn.Module) else []


def _gradient_sync(module: nn.Module):
    """An FSDP-sharded stage's switch for its own gradient reduction (None for other stages)."""
    engine = getattr(module, "_engine", None)
    return engine.set_requires_gradient_sync if engine is not None else None


__all__ = [
    "SCHEDULES",
    "block_times",
    "broadcast_groups",
    "defer_weight_gradients",
    "group_times",
    "gpt_blocks",
    "Pipeline",
    "make_schedule",
    "split_by_parameters",
    "split_by_time",
    "stage_modules",
    "validate",
]
