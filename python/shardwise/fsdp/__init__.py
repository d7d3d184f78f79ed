"""Fully sharded data parallelism with a C++ engine (``csrc/fsdp/``); see docs/fsdp.md."""

from .config import ConfigError, FSDPConfig
from .fsdp2 import FSDPModule, fully_shard
from .module import FullyShardedDataParallel, wrap

__all__ = [
    "ConfigError",
    "FSDPConfig",
    "FSDPModule",
    "FullyShardedDataParallel",
    "fully_shard",
    "wrap",
]
