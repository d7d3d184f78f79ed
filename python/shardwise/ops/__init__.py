"""Typed Python wrappers of the ``torch.ops.shardwise`` ops, with their fake kernels."""

from . import collectives, optim, sharding
from .precision import cast, cast_check_finite, cast_stochastic_bf16, multi_cast_

__all__ = [
    "collectives",
    "sharding",
    "cast",
    "cast_check_finite",
    "cast_stochastic_bf16",
    "multi_cast_",
    "optim",
]
