"""Tensor-parallel styles: how one module is split and what its forward communicates. Each style
shards the module's parameters in place (names stay, so state dicts keep their keys) and points
its ``forward`` at the C++ layer. A parameter shared by two modules (a tied embedding and head)
is cut once and stays shared."""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import _C
from . import functional as tpf


@dataclass
class Context:
    """What styles need: the group, this rank and size, the root module, and the parameters
    already cut (id of the full parameter -> (shard, dim, chunks))."""

    group: object
    rank: int
    size: int
    root: nn.Module
    cut: dict = field(default_factory=dict)


def _shard(ctx: Context, module: nn.Module, name: str, attr: str, dim: int, chunks: int = 1):
    """Replaces ``module.<attr>`` by this rank's shard along ``dim`` (``chunks`` fused parts),
    reusing the shard of a parameter another module already cut the same way."""
    full = getattr(module, attr)
    if full is None:
        return
    key = id(full)
    if key in ctx.cut:
        shard, cut_dim, cut_chunks = ctx.cut[key]
        if (cut_dim, cut_chunks) != (dim, chunks):
            raise ValueError(
                f"tensor parallel: module '{name}': {attr} is shared with a module already split "
                f"on dim {cut_dim} ({cut_chunks} parts), but this style splits it on dim {dim} "
                f"({chunks} parts); give tied modules styles that split the weight the same way"
            )
    else:
        data = _C.tp_shard_tensor(full.detach(), dim, chunks, ctx.rank, ctx.size, name, attr)
        shard = nn.Parameter(data, requires_grad=full.requires_grad)
        shard.tp_shard = (dim, chunks)  # full_tensor() and checkpoints gather along this
        ctx.cut[key] = (shard, dim, chunks)
    setattr(module, attr, shard)


def _expect(module: nn.Module, kinds, name: str, style: str):
    if not isinstance(module, kinds):
        valid = ", ".join(k.__name__ for k in kinds)
        raise TypeError(
            f"tensor parallel: module '{name}' is {type(module).__name__}; {style} applies to "
            f"{valid}; give '{name}' another style or leave it out of the plan"
        )


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's linear layers): ``weight`` stored [in, out]."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _expect_linear(module: nn.Module, name: str, style: str) -> bool:
    """Checks ``module`` is an ``nn.Linear`` or a transformers ``Conv1D``; True for a Conv1D."""
    if is_conv1d(module):
        return True
    if not isinstance(module, nn.Linear):
        raise TypeError(
            f"tensor parallel: module '{name}' is {type(module).__name__}; {style} applies to "
            f"nn.Linear and transformers' Conv1D; give '{name}' another style or leave it out "
            "of the plan"
        )
    return False


@dataclass(frozen=True)
class ColwiseParallel:
    """``nn.Linear`` split on its output features: ``weight`` [out / tp, in], ``bias`` split too.
    ``chunks`` > 1 splits each of that many fused parts (3 for a QKV projection, so each rank
    gets its heads of q, k and v); ``heads`` (if given) must divide by the tp size.
    ``sequence_parallel``: the input arrives split along ``sequence_dim`` and is gathered;
    ``save_gathered``: the gathered input is saved for backward instead of gathered again."""

    chunks: int = 1
    heads: int | None = None
    sequence_parallel: bool = False
    sequence_dim: int = 1
    save_gathered: bool = False

    def weight_dim(self, module: nn.Module) -> int:
        """The dimension of ``module.weight`` this style cuts (a Conv1D stores it [in, out])."""
        return 1 if is_conv1d(module) else 0

    def apply(self, module: nn.Module, name: str, ctx: Context) -> None:
        conv = _expect_linear(module, name, type(self).__name__)
        _shard(ctx, module, name, "weight", self.weight_dim(module), self.chunks)
        _shard(ctx, module, name, "bias", 0, self.chunks)
        group, sp, dim, keep = (
            ctx.group,
            self.sequence_parallel,
            self.sequence_dim,
            self.save_gathered,
        )

        def forward(self_, x):
            weight = self_.weight.t() if conv else self_.weight
            return tpf.column_parallel_linear(x, weight, self_.bias, group, sp, dim, keep)

        module.forward = types.MethodType(forward, module)
        if conv:
            module.nf = module.weight.shape[1]


@dataclass(frozen=True)
class RowwiseParallel:
    """``nn.Linear`` split on its input features: ``weight`` [out, in / tp], the bias replicated
    and added after the all-reduce (``sequence_parallel``: after a reduce-scatter along
    ``sequence_dim``, the bias gradient summed over the group)."""

    sequence_parallel: bool = False
    sequence_dim: int = 1

    def weight_dim(self, module: nn.Module) -> int:
        return 0 if is_conv1d(module) else 1

    def apply(self, module: nn.Module, name: str, ctx: Context) -> None:
        conv = _expect_linear(module, name, "RowwiseParallel")
        _shard(ctx, module, name, "weight", self.weight_dim(module))
        group, sp, dim = ctx.group, self.sequence_parallel, self.sequence_dim

        def forward(self_, x):
            weight = self_.weight.t() if conv else self_.weight
            return tpf.row_parallel_linear(x, weight, self_.bias, group, sp, dim)

        module.forward = types.MethodType(forward, module)
        if conv:
            module.nx = module.weight.shape[0]


@dataclass(frozen=True)
class VocabParallelEmbedding:
    """``nn.Embedding`` split on the vocabulary (rows); ids outside a rank's range are masked and
    the partial embeddings all-reduced (``sequence_parallel``: reduce-scattered along
    ``sequence_dim``)."""

    sequence_parallel: bool = False
    sequence_dim: int = 1

    def weight_dim(self, module: nn.Module) -> int:
        return 0

    def apply(self, module: nn.Module, name: str, ctx: Context) -> None:
        _expect(module, (nn.Embedding,), name, "VocabParallelEmbedding")
        if module.padding_idx is not None or module.max_norm is not None:
            raise ValueError(
                f"tensor parallel: module '{name}': padding_idx/max_norm are not supported by "
                "VocabParallelEmbedding; build the embedding without them"
            )
        vocab = module.weight.shape[0]
        _shard(ctx, module, name, "weight", 0)
        start = ctx.rank * (vocab // ctx.size)
        group, sp, dim = ctx.group, self.sequence_parallel, self.sequence_dim

        def forward(self_, ids):
            return tpf.vocab_parallel_embedding(ids, self_.weight, start, group, sp, dim)

        module.forward = types.MethodType(forward, module)


@dataclass(frozen=True)
class LossParallel(ColwiseParallel):
    """The output head: ``ColwiseParallel`` (logits split on the vocabulary, never gathered),
    and the root module's ``cross_entropy(logits, targets)`` becomes the vocabulary-parallel
    cross-entropy (max, target logit and sum-exp reductions; ``ignore_index``; mean over the real
    tokens)."""

    ignore_index: int = -100

    def apply(self, module: nn.Module, name: str, ctx: Context) -> None:
        vocab = module.weight.shape[self.weight_dim(module)]
        super().apply(module, name, ctx)
        start = ctx.rank * (vocab // ctx.size)
        group, ignore = ctx.group, self.ignore_index

        def cross_entropy(logits, targets, reduction="mean"):
            return tpf.cross_entropy(logits, targets, group, start, ignore, reduction)

        ctx.root.cross_entropy = cross_entropy


@dataclass(frozen=True)
class SequenceParallel:
    """A norm (``nn.LayerNorm``, ``nn.RMSNorm``) that runs on this rank's slice of the sequence:
    its parameters stay replicated and their gradients are summed over the group (each rank saw
    only its tokens)."""

    def apply(self, module: nn.Module, name: str, ctx: Context) -> None:
        _expect(module, (nn.LayerNorm, nn.RMSNorm), name, "SequenceParallel")
        group = ctx.group

        def summed(p):
            return None if p is None else tpf.copy_to_region(p, group)

        if isinstance(module, nn.LayerNorm):

            def forward(self_, x):
                return F.layer_norm(
                    x, self_.normalized_shape, summed(self_.weight), summed(self_.bias), self_.eps
                )
        else:

            def forward(self_, x):
                return F.rms_norm(x, self_.normalized_shape, summed(self_.weight), self_.eps)

        module.forward = types.MethodType(forward, module)


@dataclass(frozen=True)
class ScatterSequence:
    """Any module whose output is replicated but should leave split along ``dim`` (e.g. the
    position embedding, whose [seq, hidden] output is cut to this rank's positions); the
    gradient is all-gathered back, so the replicated parameters stay in step."""

    dim: int = 0

    def apply(self, module: nn.Module, name: str, ctx: Context) -> None:
        group, dim, inner = ctx.group, self.dim, module.forward

        def forward(*args, **kwargs):
            return tpf.scatter_along(inner(*args, **kwargs), dim, group)

        module.forward = forward


def is_sharded(p: torch.Tensor) -> bool:
    return hasattr(p, "tp_shard")


@dataclass(frozen=True)
class LocalCounts:
    """A module whose own forward reads integer attributes counting split features or heads
    (GPT-2's attention splits its fused QKV output by ``split_size``): each attribute in
    ``names`` is divided by the tp size, so the forward sees this rank's share. The module's
    parameters are untouched (its linear layers get their own styles)."""

    names: tuple[str, ...]

    def validate(self, module: nn.Module, name: str, tp: int) -> None:
        for attr in self.names:
            value = getattr(module, attr, None)
            if not isinstance(value, int):
                raise TypeError(
                    f"tensor parallel: module '{name}' has no integer attribute '{attr}'; "
                    f"LocalCounts names the counts its forward reads"
                )
            if value % tp:
                raise ValueError(
                    f"tensor parallel: module '{name}': {attr} = {value} is not divisible by "
                    f"the tensor-parallel size {tp}; choose a tp size that divides {value}"
                )

    def apply(self, module: nn.Module, name: str, ctx: Context) -> None:
        self.validate(module, name, ctx.size)
        for attr in self.names:
            setattr(module, attr, getattr(module, attr) // ctx.size)
