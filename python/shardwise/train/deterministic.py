"""The deterministic mode's forward and backward (``training.deterministic``): the same bits at
every data-parallel size.

A global batch is ``M = accumulation × W`` micro-batches; rank ``r`` computes micro-batch
``m = j·W + r`` in accumulation step ``j`` (the contiguous data order of C++
``data/batch_order.h``: the same samples whichever rank computes it). Each micro-batch's loss is
divided by ``M`` (not by the local count), its dropout seeded by ``(seed, step, m, block)``
(``seeds.py``). Its
gradients, flattened in float32, are summed over the data ranks by the tree over the rank index
(``_C.tree_all_reduce_``, C++ ``distributed/tree_reduce.h``), and the ``accumulation`` results
by the same tree over ``j`` (``_C.PairwiseGradients``): together the balanced binary tree over
``m``, whatever ``W`` is. The loss reported is the exact sum (``math.fsum``) of the ``M`` losses
over ``M``.

Under FSDP and ZeRO the engines do the same in C++ (``UnitOptions::deterministic``,
``ZeroOptions::deterministic``): the tree reduce-scatter of each micro-batch, the tree over
micro-batches of the reduced shards, and the clip's norm summed exactly
(``distributed/exact_norm.h``).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .. import _C
from .parallelize import Parallel, autocast_context


def forward_backward(par: Parallel, batches, step: int, group) -> tuple[float, float]:
    """Gradients of the global batch's mean loss into ``p.grad`` (float32 sums, cast to the
    parameters' dtype; FSDP's and ZeRO's engines sum their shards themselves); returns (this
    rank's mean loss, the global batch's mean loss)."""
    if par.pipe is not None:
        return _pipeline_forward_backward(par, batches, step, group)
    size = dist.get_world_size(group) if group is not None else 1
    rank = dist.get_rank(group) if group is not None else 0
    total = len(batches) * size
    params = [p for p in par.params if p.requires_grad]
    tree = _C.PairwiseGradients()
    losses = []
    for j, (x, y) in enumerate(batches):
        par.seeds.start(step, j * size + rank)
        with autocast_context(par.autocast, par.options.device):
            loss = par.gpt.cross_entropy(par.forward(x), y)
        (loss / total).backward()
        losses.append(loss.detach().double())
        if par.kind != "ddp":  # the engine reduces by the tree itself
            continue
        flat = torch.cat([_grad(p).reshape(-1).float() for p in params])
        for p in params:
            p.grad = None
        if size > 1:
            _C.tree_all_reduce_(group, flat)
        tree.push([flat])
    if par.kind == "ddp":
        summed, offset = tree.finish()[0], 0
        for p in params:
            p.grad = summed[offset : offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()
    mine, values = _gathered(par, torch.stack(losses).tolist(), len(losses), group)
    return math.fsum(mine) / len(mine), math.fsum(values) / total


def _pipeline_forward_backward(par: Parallel, batches, step: int, group) -> tuple[float, float]:
    """The pipeline (C++ ``PipelineOptions::deterministic``) sums each step's microbatches as the
    tree over their index and the data ranks; the accumulation steps ``j`` are the tree's upper
    levels (micro-batch ``m = (j·W + r)·c + k`` of ``c`` per step). Returns (this rank's mean
    loss on the last stage, else 0; the global batch's mean loss)."""
    params = [p for p in par.params if p.requires_grad]
    tree, losses = _C.PairwiseGradients(), []
    size = dist.get_world_size(group) if group is not None else 1
    rank = dist.get_rank(group) if group is not None else 0
    c = par.pipe.schedule.num_microbatches
    for j, (x, y) in enumerate(batches):
        par.seeds.start_pipeline_call(step, (j * size + rank) * c)
        par.pipe.step(x, y)
        losses += par.pipe.last["losses"]
        if len(batches) > 1:
            tree.push([_grad(p).float() for p in params])
            for p in params:
                p.grad = None
    if len(batches) > 1:
        for p, summed in zip(params, tree.finish(), strict=True):
            p.grad = summed.to(p.dtype)
    mine, values = _gathered(par, losses, len(batches) * c, group)
    local = math.fsum(mine) / len(mine) if par.is_last else 0.0
    return local, math.fsum(values) / len(values)


def eval_loss(par: Parallel, batches, group) -> float:
    """The eval loss without gradients: each micro-batch's (each pipeline microbatch's) loss,
    gathered over the pipeline and data ranks, summed exactly over their count."""
    losses = []
    for x, y in batches:
        if par.pipe is not None:
            losses += par.pipe.evaluate_losses(x, y)
        else:
            with autocast_context(par.autocast, par.options.device):
                losses.append(par.gpt.cross_entropy(par.forward(x), y).item())
    count = len(batches) * (par.pipe.schedule.num_microbatches if par.pipe is not None else 1)
    _, values = _gathered(par, losses, count, group)
    return math.fsum(values) / len(values)


def _gathered(par: Parallel, losses: list[float], count: int, group):
    """(this rank's ``count`` losses, every data rank's): a pipeline's are on its last stage,
    shared with the other stages first (the others add zeros)."""
    mine = torch.tensor(losses if par.is_last else [0.0] * count, dtype=torch.float64)
    if par.pipe is not None and par.axes.pipeline_group is not None:
        dist.all_reduce(mine, group=par.axes.pipeline_group)
    size = dist.get_world_size(group) if group is not None else 1
    every = [mine] if size == 1 else [torch.empty_like(mine) for _ in range(size)]
    if size > 1:
        dist.all_gather(every, mine, group=group)
    return mine.tolist(), [v for t in every for v in t.tolist()]


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float | None) -> float:
    """Replicated gradients clipped by their exact norm (C++ ``clip_grad_norm_exact_``, which
    FSDP's engine runs over its shards in this mode, so the strategies agree too)."""
    grads = [p.grad for p in params if p.grad is not None]
    return _C.clip_grad_norm_exact_(grads, max_norm or math.inf)


def _grad(p: torch.Tensor) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)
