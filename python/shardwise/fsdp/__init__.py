"""Fully sharded data parallelism with a C++ engine (``csrc/fsdp/``); see docs/fsdp.md."""

from .config import ConfigError, FSDPConfig
from .module import FullyShardedDataParallel, wrap

__all__ = ["ConfigError", "FSDPConfig", "FullyShardedDataParallel", "wrap"]
