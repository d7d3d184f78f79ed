"""The fused sharding copies around FSDP's collectives (C++: ``csrc/sharding/``).

Layout (``csrc/sharding/flat_layout.h``): parameter ``i`` is cut into ``world_size`` pieces of
``chunk(i) = ceil(numel[i] / world_size)`` elements rounded up to a multiple of
``_C.FlatLayout.align``; rank ``r``'s shard is its piece of every parameter, end to end; the
communication buffer is the shards of all ranks, rank-major. The sizes come from that C++ layout
(``_C.FlatLayout``); these wrappers and fake kernels only compute shapes; the work is in C++.
"""

import torch

from .. import _C


def chunk(numel: int, world_size: int) -> int:
    """Elements of one rank's piece of a parameter of ``numel`` elements (padding included)."""
    return _C.FlatLayout([numel], world_size).chunk(0)


def shard_numel(numels, world_size: int) -> int:
    """Elements of one rank's shard of a group of parameters."""
    return _C.FlatLayout(list(numels), world_size).shard_numel()


def valid(numel: int, world_size: int, rank: int) -> int:
    """Elements of a parameter that ``rank`` holds (the rest of its piece is padding)."""
    return _C.FlatLayout([numel], world_size).valid(0, rank)


def all_gather_copy_in(shards, numels, world_size: int, rank: int, dtype) -> torch.Tensor:
    """This rank's shard (1-D, ``dtype``) packed from its piece of every parameter."""
    return torch.ops.shardwise.all_gather_copy_in.default(shards, numels, world_size, rank, dtype)


def all_gather_copy_out(gathered: torch.Tensor, numels, world_size: int) -> list[torch.Tensor]:
    """Full flat parameters out of the all-gathered buffer."""
    return torch.ops.shardwise.all_gather_copy_out.default(gathered, numels, world_size)


def all_gather_copy_out_(gathered: torch.Tensor, numels, world_size: int, params) -> None:
    """In-place form: writes the full flat parameters into ``params``."""
    torch.ops.shardwise.all_gather_copy_out_.default(gathered, numels, world_size, params)


def reduce_scatter_copy_in(grads, numels, world_size: int, dtype, scale: float = 1.0):
    """The reduce-scatter input: gradients (or None) in rank-major pieces, cast and scaled."""
    if all(g is None for g in grads):  # the dispatcher needs a tensor to pick a device
        raise ValueError(
            "shardwise.reduce_scatter_copy_in: every gradient is None; pass at least one tensor"
        )
    return torch.ops.shardwise.reduce_scatter_copy_in.default(
        grads, numels, world_size, dtype, scale
    )


def reduce_scatter_copy_in_(grads, numels, world_size: int, scale: float, buffer) -> None:
    """In-place form into a reused ``buffer`` (its dtype is the reduce dtype)."""
    torch.ops.shardwise.reduce_scatter_copy_in_.default(grads, numels, world_size, scale, buffer)


def reduce_scatter_copy_out(reduced, numels, world_size: int, rank: int, dtype, scale=1.0):
    """New sharded gradients from this rank's reduced block, scaled."""
    return torch.ops.shardwise.reduce_scatter_copy_out.default(
        reduced, numels, world_size, rank, dtype, scale
    )


def reduce_scatter_copy_out_(
    reduced, numels, world_size: int, rank: int, scale, shard_grads, accumulate: bool = True
):
    """Adds this rank's reduced block, scaled, to ``shard_grads`` in place (or, with
    ``accumulate=False``, overwrites them)."""
    torch.ops.shardwise.reduce_scatter_copy_out_.default(
        reduced, numels, world_size, rank, scale, shard_grads, accumulate
    )


@torch.library.register_fake("shardwise::all_gather_copy_in")
def _all_gather_copy_in_fake(shards, numels, world_size, rank, dtype):
    return shards[0].new_empty((shard_numel(numels, world_size),), dtype=dtype)


@torch.library.register_fake("shardwise::all_gather_copy_out")
def _all_gather_copy_out_fake(gathered, numels, world_size):
    return [gathered.new_empty((n,)) for n in numels]


@torch.library.register_fake("shardwise::all_gather_copy_out_")
def _all_gather_copy_out_inplace_fake(gathered, numels, world_size, params):
    return None


@torch.library.register_fake("shardwise::reduce_scatter_copy_in")
def _reduce_scatter_copy_in_fake(grads, numels, world_size, dtype, scale=1.0):
    first = next(g for g in grads if g is not None)
    return first.new_empty((shard_numel(numels, world_size) * world_size,), dtype=dtype)


@torch.library.register_fake("shardwise::reduce_scatter_copy_in_")
def _reduce_scatter_copy_in_inplace_fake(grads, numels, world_size, scale, buffer):
    return None


@torch.library.register_fake("shardwise::reduce_scatter_copy_out")
def _reduce_scatter_copy_out_fake(reduced, numels, world_size, rank, dtype, scale=1.0):
    return [reduced.new_empty((valid(n, world_size, rank),), dtype=dtype) for n in numels]


@torch.library.register_fake("shardwise::reduce_scatter_copy_out_")
def _reduce_scatter_copy_out_inplace_fake(
    reduced, numels, world_size, rank, scale, shard_grads, accumulate=True
):
    return None
