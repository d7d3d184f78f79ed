"""The C++ tensor-parallel layers and regions (``shardwise._C.tp_*``) under Python names.
``group`` is any ``torch.distributed`` process group; activations are ``[batch, seq, hidden]``
and, with ``sequence_parallel``, split along ``sequence_dim`` outside the layers."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import _C


def _group(group):
    return group if group is not None else dist.group.WORLD


def column_parallel_linear(
    x, weight, bias, group=None, sequence_parallel=False, sequence_dim=1, save_gathered=False
):
    """``x @ weight.T + bias`` with ``weight`` this rank's output rows; backward all-reduces the
    input gradient (reduce-scatters it under sequence parallelism), overlapped with the weight
    gradient. ``save_gathered`` (sequence parallelism): keep the gathered input for backward
    instead of gathering it again (one all-gather less, tp times the saved input's memory)."""
    return _C.tp_column_parallel_linear(
        x, weight, bias, _group(group), sequence_parallel, sequence_dim, save_gathered
    )


def row_parallel_linear(x, weight, bias, group=None, sequence_parallel=False, sequence_dim=1):
    """``x`` (this rank's input features) times this rank's weight columns, all-reduced (or
    reduce-scattered along the sequence), then the replicated bias added once."""
    return _C.tp_row_parallel_linear(
        x, weight, bias, _group(group), sequence_parallel, sequence_dim
    )


def vocab_parallel_embedding(
    ids, weight, vocab_start, group=None, sequence_parallel=False, sequence_dim=1
):
    """Embedding of ``ids`` with ``weight`` this rank's vocabulary rows from ``vocab_start``."""
    return _C.tp_vocab_parallel_embedding(
        ids, weight, vocab_start, _group(group), sequence_parallel, sequence_dim
    )


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    group=None,
    vocab_start: int | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.cross_entropy`` of logits split on the vocabulary (this rank's ``[..., V / tp]``,
    starting at ``vocab_start``, by default ``rank * V / tp``) without gathering them."""
    group = _group(group)
    if vocab_start is None:
        vocab_start = group.rank() * logits.shape[-1]
    return _C.tp_vocab_parallel_cross_entropy(
        logits, targets, group, vocab_start, ignore_index, reduction
    )


def parallel_self_attention(
    x,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    local_heads,
    group=None,
    causal=True,
    sequence_parallel=False,
):
    """Column-parallel fused QKV (this rank's heads), attention, row-parallel projection."""
    return _C.tp_parallel_self_attention(
        x,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        local_heads,
        causal,
        _group(group),
        sequence_parallel,
    )


def copy_to_region(x, group=None):
    """Identity forward, all-reduce of the gradient backward (Megatron's f)."""
    return _C.tp_copy_to_region(x, _group(group))


def reduce_from_region(x, group=None):
    """All-reduce forward, identity backward (Megatron's g)."""
    return _C.tp_reduce_from_region(x, _group(group))


def gather_along(x, dim, group=None):
    """All-gather along ``dim`` forward, reduce-scatter backward."""
    return _C.tp_gather_along(x, dim, _group(group))


def reduce_scatter_along(x, dim, group=None):
    """Reduce-scatter along ``dim`` forward, all-gather backward."""
    return _C.tp_reduce_scatter_along(x, dim, _group(group))


def scatter_along(x, dim, group=None):
    """This rank's slice along ``dim`` forward, all-gather backward."""
    return _C.tp_scatter_along(x, dim, _group(group))
