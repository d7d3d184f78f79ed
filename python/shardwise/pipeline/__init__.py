"""Pipeline parallelism (C++: ``csrc/pipeline/``): schedules generated and validated in C++, and
the C++ executor running this rank's stages. This module only adapts: it cuts a batch into
microbatches and hands nn.Modules and a loss function to the executor."""

from __future__ import annotations

import copy
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


def validate(schedule, forward: float = 1.0, backward: float = 2.0, buffered_sends: bool = True):
    """Simulates every rank: ok/error, makespan, bubble fraction, peak stashed microbatches."""
    return _C.validate_pipeline_schedule(schedule, forward, backward, buffered_sends)


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


def _groups(starts: list[int], count: int) -> list[list[int]]:
    bounds = [*starts, count]
    return [list(range(bounds[k], bounds[k + 1])) for k in range(len(starts))]


def split_by_parameters(blocks: Sequence[nn.Module], num_stages: int) -> list[list[int]]:
    """Contiguous groups of block indices, one per stage, whose largest parameter count is as
    small as possible (C++ balanced_partition)."""
    sizes = [float(sum(p.numel() for p in b.parameters())) for b in blocks]
    return _groups(_C.balanced_partition(sizes, num_stages), len(blocks))


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
    through the blocks in order). The cut balances the blocks' own times (C++
    balanced_partition); with ``refine``, each boundary is then moved by one block while that
    lowers the slowest stage timed as a whole (a stage is not the sum of its blocks: caches,
    casts and its output conversion), so near-ties are settled by what the stages really take.
    With ``loss_fn``, the last block is timed with ``loss_fn(output, target)`` as the
    pipeline's last stage runs it. Runs under the caller's autocast, if any. Timing differs
    between processes: split on one rank and broadcast the groups (``broadcast_groups``)."""
    costs = block_times(blocks, sample, repeats, loss_fn, target)
    starts = list(_C.balanced_partition(costs, num_stages))
    if refine and num_stages > 1:
        starts = _refine(blocks, starts, sample, repeats, loss_fn, target)
    return _groups(starts, len(blocks))


def _refine(blocks, starts, sample, repeats, loss_fn, target) -> list[int]:
    """Moves single boundaries (one block either way) while the slowest stage, timed whole,
    gets at least 1% faster."""

    def slowest(cut: list[int]) -> float:
        return max(group_times(blocks, _groups(cut, len(blocks)), sample, repeats, loss_fn, target))

    best, best_time = starts, slowest(starts)
    for _ in range(2 * len(starts)):
        candidates = []
        for k in range(1, len(best)):
            for step in (-1, 1):
                cut = list(best)
                cut[k] += step
                upper = cut[k + 1] if k + 1 < len(cut) else len(blocks)
                if cut[k - 1] < cut[k] < upper:
                    candidates.append(cut)
        timed = [(slowest(cut), cut) for cut in candidates]
        if not timed or min(timed)[0] >= 0.99 * best_time:
            break
        best_time, best = min(timed)
    return best


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
    """Forward + backward seconds of each group of consecutive blocks run as one stage (the
    fastest of ``repeats`` after one warm-up: the least disturbed run); a group's input is
    the previous group's output as a fresh leaf, the last group ends in ``loss_fn`` if given."""
    import time

    costs, x = [], sample
    for group in groups:
        stage = [blocks[i] for i in group]
        last = loss_fn is not None and group[-1] == len(blocks) - 1
        times = []
        for _ in range(repeats + 1):
            out = x.detach().requires_grad_(x.is_floating_point())
            start = time.perf_counter()
            for block in stage:
                out = block(out)
            (loss_fn(out, target) if last else out.float().sum()).backward()
            times.append(time.perf_counter() - start)
        for block in stage:
            block.zero_grad(set_to_none=True)
        costs.append(min(times[1:]))
        x = out.detach()
    return costs


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
            return self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))

    class Head(nn.Module):
        def __init__(self, norm, head):
            super().__init__()
            self.norm, self.head = norm, copy.copy(head)  # keeps a tensor-parallel forward
            self.head._parameters = dict(head._parameters)
            weight = nn.Parameter(head.weight.detach().clone())
            if hasattr(head.weight, "tp_shard"):  # a tensor-parallel shard stays one
                weight.tp_shard = head.weight.tp_shard
            self.head.weight = weight
            if "forward" in head.__dict__:  # a style's forward, bound to the original module
                self.head.forward = types.MethodType(head.forward.__func__, self.head)

        def forward(self, x):
            return self.head(self.norm(x))

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
    blocks = [Embedding(model.embed, model.pos), *middle, Head(model.norm, model.head)]
    return blocks, (("embed.weight", "head.weight") if tied else None)


class MeshGroups:
    """The process groups of a data × pipeline mesh, ``mesh_shape`` in the form of seed 000:
    ``[[data, pipeline], ["dp" | "fsdp", "pp"]]``. The last axis varies fastest, so a pipeline
    is a run of consecutive ranks and a data-parallel group takes every ``pipeline``-th rank."""

    def __init__(self, mesh_shape):
        try:
            (data, pipe), (data_kind, pipe_kind) = mesh_shape
        except (TypeError, ValueError):
            raise ValueError(
                f"mesh_shape {mesh_shape!r}: expected [[data, pipeline], ['dp' or 'fsdp', 'pp']]"
            ) from None
        if data_kind not in ("dp", "fsdp") or pipe_kind != "pp":
            raise ValueError(
                f"mesh_shape axes {[data_kind, pipe_kind]}: use ['dp', 'pp'] or ['fsdp', 'pp']"
            )
        world = dist.get_world_size()
        if data * pipe != world:
            raise ValueError(
                f"mesh_shape {mesh_shape}: {data} × {pipe} = {data * pipe} ranks but the world has "
                f"{world}; make the product equal the world size"
            )
        rank = dist.get_rank()
        self.data_kind, self.data_size, self.pipeline_size = data_kind, data, pipe
        self.data_rank, self.pipeline_rank = divmod(rank, pipe)
        self.pipeline_group = self.data_group = None
        for d in range(data):  # every rank creates every group, in the same order
            group = dist.new_group([d * pipe + k for k in range(pipe)])
            if d == self.data_rank:
                self.pipeline_group = group
        for k in range(pipe):
            group = dist.new_group([d * pipe + k for d in range(data)])
            if k == self.pipeline_rank:
                self.data_group = group


class Pipeline:
    """Runs ``stages`` (this rank's stage modules, keyed by stage index) under a schedule.

    ``loss_fn(output, target)`` is applied on the last stage per microbatch; ``step(inputs,
    targets)`` cuts both into the schedule's microbatches and returns the mean loss (on the
    rank of the last stage; 0 elsewhere). Gradients accumulate into the stage modules' ``.grad``.
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
    ):
        if schedule.name == "zb_h1" and any(hasattr(m, "_engine") for m in stages.values()):
            raise ValueError(
                "schedule zb_h1 defers weight gradients past the backward, where FSDP reduces "
                "them; use 1f1b (or interleaved_1f1b) for FSDP-sharded stages"
            )
        if group is None and schedule.num_ranks > 1:
            group = dist.group.WORLD
        self.rank = rank if rank is not None else (dist.get_rank(group) if group else 0)
        self.schedule = schedule
        self.stages = stages
        self.data_parallel_group = data_parallel_group
        self._group = group
        # Tied parameters on two stages (e.g. the embedding on the first, the head on the last):
        # (stage_a, name in stage a, stage_b, name in stage b). Stage b starts from stage a's
        # values; after every step each side's gradient becomes the sum of both.
        self.tied = list(tied)
        for a, name_a, b, name_b in self.tied:
            self._exchange_tied(a, name_a, b, name_b, initial=True)
        self._targets: list[torch.Tensor] = []
        ids = sorted(stages)
        self._executor = _C.PipelineExecutor(
            ids,
            [stages[i] for i in ids],
            schedule,
            self.rank,
            group,
            lambda output, i: loss_fn(output, self._targets[i]),
            self._before_last_backward,
        )
        self.last = None

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float:
        m = self.schedule.num_microbatches
        self._targets = list(targets.chunk(m)) if targets is not None else []
        chunks = list(inputs.chunk(m)) if inputs is not None else []
        for name, parts in (("inputs", chunks), ("targets", self._targets)):
            if parts and len(parts) != m:
                raise ValueError(
                    f"{name}: a batch of {len(parts)} rows cannot make {m} microbatches"
                )
        for stage in self.stages.values():  # FSDP stages: no reduction until their last backward
            if hasattr(stage, "_engine"):
                stage._engine.set_requires_gradient_sync(False)
        self.last = self._executor.step(chunks)
        for a, name_a, b, name_b in self.tied:
            self._exchange_tied(a, name_a, b, name_b, initial=False)
        self._sync_data_parallel()
        return self.last["loss"]

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

    def _exchange_tied(self, a: int, name_a: str, b: int, name_b: str, initial: bool) -> None:
        """initial: stage a's values to stage b. Else: both gradients := their sum (one
        exchange between the two ranks, nothing for the others)."""
        ranks = self.schedule.num_ranks
        rank_a, rank_b = a % ranks, b % ranks
        if self.rank not in (rank_a, rank_b):
            return
        mine = dict(self.stages[a if self.rank == rank_a else b].named_parameters())[
            name_a if self.rank == rank_a else name_b
        ]
        if rank_a == rank_b:  # both stages here
            other = dict(self.stages[b].named_parameters())[name_b]
            if initial:
                other.data.copy_(mine.data)
            elif mine.grad is not None and other.grad is not None:
                total = mine.grad + other.grad
                mine.grad.copy_(total)
                other.grad.copy_(total)
            return
        peer = dist.get_global_rank(self._group, rank_b if self.rank == rank_a else rank_a)
        if initial:
            if self.rank == rank_a:
                dist.send(mine.data.contiguous(), peer, group=self._group)
            else:
                received = torch.empty_like(mine.data)
                dist.recv(received, peer, group=self._group)
                mine.data.copy_(received)
            return
        grad = mine.grad if mine.grad is not None else torch.zeros_like(mine)
        theirs = torch.empty_like(grad)
        ops = [
            dist.P2POp(dist.isend, grad.contiguous(), peer, self._group),
            dist.P2POp(dist.irecv, theirs, peer, self._group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        mine.grad = grad + theirs

    def _before_last_backward(self, stage: int) -> None:
        module = self.stages[stage]
        if hasattr(module, "_engine"):  # shardwise.FullyShardedDataParallel
            module._engine.set_requires_gradient_sync(True)

    def _sync_data_parallel(self) -> None:
        """Replicated stages: average the gradients over the data-parallel group, once per step,
        in one all-reduce (FSDP stages reduced theirs in their last backward)."""
        group = self.data_parallel_group
        if group is None or dist.get_world_size(group) == 1:
            return
        grads = [
            p.grad
            for m in self.stages.values()
            if not hasattr(m, "_engine")
            for p in m.parameters()
            if p.grad is not None
        ]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        flat /= dist.get_world_size(group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


__all__ = [
    "SCHEDULES",
    "MeshGroups",
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
