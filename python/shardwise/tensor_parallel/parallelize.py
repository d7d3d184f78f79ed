"""``parallelize(model, tp_group, plan)``: apply tensor-parallel styles to the modules a plan
names, in place; the ready plan for the bundled GPT and the documented one for Llama-style
blocks; and ``full_tensor`` to put a split parameter (or its gradient) back together."""

from __future__ import annotations

import fnmatch

import torch
import torch.distributed as dist
from torch import nn

from . import styles as st


def parallelize(model: nn.Module, tp_group, plan: dict) -> nn.Module:
    """Applies ``plan`` ({module-name pattern: style}, ``fnmatch`` wildcards, e.g.
    ``"blocks.*.qkv"``) to ``model`` over ``tp_group`` and returns it. Every pattern must match a
    module and no module may match two patterns. A group of one rank (or None) leaves the model
    as it is, so tp = 1 runs the same code. Build the optimizer afterwards: the parameters a
    style splits are new ``nn.Parameter`` objects."""
    if tp_group is None or tp_group.size() == 1:
        return model
    names = [name for name, _ in model.named_modules() if name]
    matched: dict[str, str] = {}
    for pattern in plan:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(
                f"tensor parallel plan: pattern '{pattern}' matches no module of "
                f"{type(model).__name__}; module names look like {names[:6]}"
            )
        for name in hits:
            if name in matched:
                raise ValueError(
                    f"tensor parallel plan: module '{name}' matches both '{matched[name]}' and "
                    f"'{pattern}'; make the patterns disjoint"
                )
            matched[name] = pattern
    ctx = st.Context(tp_group, tp_group.rank(), tp_group.size(), model)
    modules = dict(model.named_modules())
    for name, pattern in matched.items():  # check every style before changing anything
        _validate(plan[pattern], modules[name], name, ctx.size)
    for name, pattern in matched.items():
        plan[pattern].apply(modules[name], name, ctx)
    model.tp_group = tp_group
    return model


def parameters_per_rank(model: nn.Module, plan: dict, tp_size: int) -> int:
    """Parameter elements one tp rank holds after ``parallelize(model, group, plan)`` with a
    group of ``tp_size`` (shared parameters once): the planner's and benchmarks' theory. The
    model may live on the meta device."""
    split: dict[int, int] = {}  # id(parameter) -> its shard's numel
    for name, module in model.named_modules():
        style = next((plan[p] for p in plan if fnmatch.fnmatchcase(name, p)), None)
        cut = {
            st.ColwiseParallel: ("weight", "bias"),
            st.LossParallel: ("weight", "bias"),
            st.RowwiseParallel: ("weight",),
            st.VocabParallelEmbedding: ("weight",),
        }.get(type(style), ())
        for attr in cut:
            p = getattr(module, attr, None)
            if p is not None:
                split[id(p)] = p.numel() // tp_size
    return sum(split.get(id(p), p.numel()) for p in model.parameters())


def _validate(style, module: nn.Module, name: str, tp: int) -> None:
    """The divisibility checks of ``style`` on ``module``, before any parameter is cut."""
    if hasattr(style, "validate"):
        style.validate(module, name, tp)
    if hasattr(style, "weight_dim") and hasattr(module, "weight"):
        dim = style.weight_dim(module)
        size = module.weight.shape[dim] // getattr(style, "chunks", 1)
        label = "vocabulary size" if isinstance(module, nn.Embedding) else "features"
        if isinstance(style, st.ColwiseParallel | st.RowwiseParallel):
            label = "output features" if isinstance(style, st.ColwiseParallel) else "input features"
        if size % tp:
            raise ValueError(
                f"tensor parallel: module '{name}': {label} = {size} is not divisible by the "
                f"tensor-parallel size {tp}; choose a tp size that divides {size} or change the "
                f"model's dimension to a multiple of {tp}"
            )
    heads = getattr(style, "heads", None)
    if heads is not None and heads % tp:
        raise ValueError(
            f"tensor parallel: module '{name}': heads = {heads} is not divisible by the "
            f"tensor-parallel size {tp}; choose a tp size that divides {heads}"
        )


def gpt_plan(
    model, sequence_parallel: bool = False, loss_parallel: bool = True, save_gathered: bool = False
) -> dict:
    """The plan for the bundled GPT (``shardwise.models.GPT``): the token embedding split on the
    vocabulary, in every block the fused QKV column-parallel by heads and the output projection
    row-parallel, the MLP's up column- and down row-parallel, and the head (tied to the
    embedding) column-parallel with the vocabulary-parallel loss. ``sequence_parallel`` also
    splits the norms' and residuals' tokens (the position embedding's output is cut to this
    rank's positions); ``save_gathered`` keeps the column-parallel layers' gathered inputs for
    backward instead of gathering them again."""
    cfg = model.cfg
    sp, keep = sequence_parallel, save_gathered and sequence_parallel
    plan = {
        "embed": st.VocabParallelEmbedding(sequence_parallel=sp),
        "blocks.*.qkv": st.ColwiseParallel(
            chunks=3, heads=cfg.heads, sequence_parallel=sp, save_gathered=keep
        ),
        "blocks.*.proj": st.RowwiseParallel(sequence_parallel=sp),
        "blocks.*.up": st.ColwiseParallel(sequence_parallel=sp, save_gathered=keep),
        "blocks.*.down": st.RowwiseParallel(sequence_parallel=sp),
        "head": st.LossParallel(sequence_parallel=sp, save_gathered=keep)
        if loss_parallel
        else st.ColwiseParallel(sequence_parallel=sp, save_gathered=keep),
    }
    if sp:
        plan.update(
            {
                "pos": st.ScatterSequence(dim=0),
                "blocks.*.norm1": st.SequenceParallel(),
                "blocks.*.norm2": st.SequenceParallel(),
                "norm": st.SequenceParallel(),
            }
        )
    return plan


def llama_plan(n_heads: int, n_kv_heads: int | None = None, sequence_parallel: bool = False):
    """The plan for Llama-style blocks named as in Meta's reference code and torchtitan
    (``tok_embeddings``, ``layers.N.attention.{wq,wk,wv,wo}``,
    ``layers.N.feed_forward.{w1,w2,w3}``, ``layers.N.{attention,ffn}_norm``, ``norm``,
    ``output``). The attention must take its local head count from the projections' shapes
    (``wq(x).shape[-1] // head_dim``), as torchtitan's does; with sequence_parallel the norms run
    on this rank's tokens and the embedding reduce-scatters along dim 1. Rotary embeddings are
    unaffected (positions are per token and the q/k heads stay whole)."""
    sp = sequence_parallel
    plan = {
        "tok_embeddings": st.VocabParallelEmbedding(sequence_parallel=sp),
        "layers.*.attention.wq": st.ColwiseParallel(heads=n_heads, sequence_parallel=sp),
        "layers.*.attention.wk": st.ColwiseParallel(
            heads=n_kv_heads or n_heads, sequence_parallel=sp
        ),
        "layers.*.attention.wv": st.ColwiseParallel(
            heads=n_kv_heads or n_heads, sequence_parallel=sp
        ),
        "layers.*.attention.wo": st.RowwiseParallel(sequence_parallel=sp),
        "layers.*.feed_forward.w1": st.ColwiseParallel(sequence_parallel=sp),
        "layers.*.feed_forward.w3": st.ColwiseParallel(sequence_parallel=sp),
        "layers.*.feed_forward.w2": st.RowwiseParallel(sequence_parallel=sp),
        "output": st.LossParallel(sequence_parallel=sp),
    }
    if sp:
        plan.update(
            {
                "layers.*.attention_norm": st.SequenceParallel(),
                "layers.*.ffn_norm": st.SequenceParallel(),
                "norm": st.SequenceParallel(),
            }
        )
    return plan


def tp_info(p: torch.Tensor) -> tuple[int, int] | None:
    """(dim, chunks) of a split parameter, None for a replicated one."""
    return getattr(p, "tp_shard", None)


def full_tensor(shard: torch.Tensor, info: tuple[int, int] | None, group) -> torch.Tensor:
    """The whole tensor from every rank's ``shard`` (a parameter's value or gradient) split as
    ``info`` = (dim, chunks) says; a replicated tensor (``info`` None) is returned as is."""
    if info is None or group is None:
        return shard
    dim, chunks = info
    parts = [torch.empty_like(shard) for _ in range(group.size())]
    dist.all_gather(parts, shard.contiguous(), group=group)
    pieces = [p.chunk(chunks, dim) for p in parts]  # [rank][chunk]
    return torch.cat([pieces[r][c] for c in range(chunks) for r in range(len(parts))], dim)


def shard_runs(full_shape, info, group) -> list[tuple[int, int, int]]:
    """(full_start, local_start, length) runs of this rank's shard in the flattened full tensor
    (one run covering everything for a replicated tensor); the C++ ``shard_runs``."""
    from .. import _C

    numel = 1
    for s in full_shape:
        numel *= int(s)
    if info is None or group is None:
        return [(0, 0, numel)]
    dim, chunks = info
    rank, size = group.rank(), group.size()
    return _C.tp_shard_runs(list(full_shape), dim, chunks, rank, size)


def clip_grad_norm_(
    params, max_norm: float, tp_group=None, split=None, shard_group=None, stage_group=None
) -> float:
    """Clips the gradients of a tensor-parallel model by their global L2 norm and returns the
    norm before clipping (C++ ``clip_grad_norm_``, ``csrc/tensor_parallel/grad_norm.h``).
    Gradients of split parameters (``split``: their ids; default: those ``parallelize`` cut) are
    squared and summed over ``tp_group``; replicated ones, equal on every tp rank, count once.
    ``shard_group``: the gradients are FSDP shards, summed over it too; ``stage_group``: the
    pipeline ranks, each holding the parameters of its own stages (summed over it)."""
    from .. import _C

    params = [p for p in params if p.grad is not None]
    split = {id(p) for p in params if tp_info(p)} if split is None else split
    return _C.tp_clip_grad_norm_(
        [p.grad for p in params if id(p) in split],
        [p.grad for p in params if id(p) not in split],
        max_norm or 0.0,
        tp_group,
        shard_group,
        stage_group,
    )
