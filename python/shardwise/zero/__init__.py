"""ZeRO stages 0-3 with DeepSpeed's config keys (C++: ``csrc/zero/``, ``csrc/optim/``)."""

from .config import load as load_config
from .engine import ZeroEngine, initialize

__all__ = ["ZeroEngine", "initialize", "load_config"]
