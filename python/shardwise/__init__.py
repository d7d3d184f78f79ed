"""shardwise: FSDP, ZeRO and pipeline parallelism for PyTorch and LibTorch, with a C++ core.

Importing the package loads the native library, which registers the ``torch.ops.shardwise`` ops.
"""

from pathlib import Path as _Path

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _torch_versions

_refused = _torch_versions.mismatch(_Path(__file__).resolve().parent, torch.__version__)
if _refused is not None:
    raise ImportError(_refused)

from . import _C, distributed  # noqa: E402, F401  (registers the "shardwise" backend)
from .fsdp import FSDPConfig, FSDPModule, FullyShardedDataParallel, fully_shard, wrap  # noqa: E402
from .ops import (  # noqa: E402
    cast,
    cast_check_finite,
    cast_stochastic_bf16,
    multi_cast_,
)

__version__ = "0.1.0"

#: The folder holding shardwise's CMake package (share/cmake/shardwise), for C++ programs built
#: against this installation, as ``torch.utils.cmake_prefix_path`` is for torch's: put both on
#: ``CMAKE_PREFIX_PATH`` (separated by ``;``) and call ``find_package(shardwise)``.
cmake_prefix_path = str(_Path(__file__).resolve().parent / "share" / "cmake")


def detected_cpu_isa() -> str:
    """The best CPU instruction set this machine supports: 'scalar', 'avx512' or 'avx512_bf16'."""
    return _C.detected_cpu_isa()


def active_cpu_isa() -> str:
    """The CPU instruction set the kernels use now (see :func:`set_cpu_isa`)."""
    return _C.active_cpu_isa()


def set_cpu_isa(name: str | None) -> None:
    """Lower the CPU instruction set the kernels use, or pass None to use the best one again.

    The environment variable ``SHARDWISE_CPU_ISA`` sets the same at start-up.
    """
    _C.set_cpu_isa(name)


def __getattr__(name: str):
    """``shardwise.Trainer`` and ``shardwise.DistributedConfig`` (training from Python), imported
    on first use: the training stack (pydantic, OmegaConf, the planner) loads only for them."""
    if name in ("Trainer", "DistributedConfig"):
        from .train import api

        return getattr(api, name)
    raise AttributeError(f"module 'shardwise' has no attribute {name!r}")


__all__ = [
    "DistributedConfig",
    "FSDPConfig",
    "FSDPModule",
    "FullyShardedDataParallel",
    "active_cpu_isa",
    "cast",
    "cast_check_finite",
    "cast_stochastic_bf16",
    "cmake_prefix_path",
    "detected_cpu_isa",
    "fully_shard",
    "multi_cast_",
    "set_cpu_isa",
    "Trainer",
    "wrap",
]
