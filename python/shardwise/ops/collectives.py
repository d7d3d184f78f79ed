"""Functional collectives: tensor in, new tensor out, over a process group of any backend.

They are ``torch.ops.shardwise.{all_reduce, all_gather_into_tensor, reduce_scatter_tensor}``
with fake kernels, so ``torch.compile(fullgraph=True)`` can trace through them.
"""

import torch
import torch.distributed as dist

REDUCE_OPS = ("sum", "avg", "product", "min", "max")


def _group_name(group) -> str:
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    return group.group_name


def all_reduce(input: torch.Tensor, reduce_op: str = "sum", group=None) -> torch.Tensor:
    """The reduction of ``input`` over ``group`` (default: the world), as a new tensor."""
    return torch.ops.shardwise.all_reduce.default(input, reduce_op, _group_name(group))


def all_gather_into_tensor(input: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's ``input`` concatenated along dim 0, in rank order."""
    size = dist.get_world_size(group)
    return torch.ops.shardwise.all_gather_into_tensor.default(input, size, _group_name(group))


def reduce_scatter_tensor(input: torch.Tensor, reduce_op: str = "sum", group=None) -> torch.Tensor:
    """This rank's block (dim 0 split by the group size) of the reduction of ``input``."""
    size = dist.get_world_size(group)
    return torch.ops.shardwise.reduce_scatter_tensor.default(
        input, reduce_op, size, _group_name(group)
    )


@torch.library.register_fake("shardwise::all_reduce")
def _all_reduce_fake(input, reduce_op, group_name):
    torch._check(reduce_op in REDUCE_OPS, lambda: f"reduce_op {reduce_op!r}; valid: {REDUCE_OPS}")
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.register_fake("shardwise::all_gather_into_tensor")
def _all_gather_fake(input, group_size, group_name):
    shape = list(input.shape) or [1]
    shape[0] *= group_size
    return input.new_empty(shape)


@torch.library.register_fake("shardwise::reduce_scatter_tensor")
def _reduce_scatter_fake(input, reduce_op, group_size, group_name):
    torch._check(input.dim() > 0 and input.shape[0] % group_size == 0)
    shape = list(input.shape)
    shape[0] //= group_size
    return input.new_empty(shape)
