"""Which torch this installation runs with, asked of its one owner: the CMake package installed
beside the library (share/cmake/shardwise/shardwiseConfig.cmake), which records the torch the
library was built against and the oldest torch shardwise supports. Checked before the native
library loads, so that a torch of another minor version (LibTorch's ABI changes between them) is
an ImportError naming both versions and the fix instead of an undefined symbol. No imports of
shardwise here: setup.py loads this file by path."""

from __future__ import annotations

import re
from pathlib import Path

CONFIG = Path("share") / "cmake" / "shardwise" / "shardwiseConfig.cmake"


def recorded(config: Path, name: str) -> str | None:
    """``set(shardwise_<name> "<value>")`` in the CMake package file ``config``, or None."""
    if not config.is_file():
        return None
    match = re.search(rf'^set\(shardwise_{name} "([^"]*)"\)', config.read_text(), re.MULTILINE)
    return match.group(1) if match else None


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.11.0+cu130'."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def mismatch(package: Path, running: str) -> str | None:
    """Why the library in ``package`` cannot run with torch ``running``, or None if it can (or if
    no CMake package is installed there to say)."""
    config = package / CONFIG
    built = recorded(config, "TORCH_VERSION")
    oldest = recorded(config, "MIN_TORCH_VERSION")
    if oldest is not None and minor(running) < minor(oldest):
        return (
            f"shardwise supports torch {oldest} and newer; this process imported torch {running}. "
            f"Install torch>={oldest}, then rebuild shardwise against it "
            "(pip install --no-build-isolation --force-reinstall shardwise)"
        )
    if built is not None and minor(built) != minor(running):
        return (
            f"shardwise's library ({package / 'lib'}) was built against torch {built}, but this "
            f"process imported torch {running}: LibTorch's ABI changes between minor versions. "
            "Rebuild shardwise against this torch (pip install --no-build-isolation "
            f"--force-reinstall shardwise), or install a torch {'.'.join(map(str, minor(built)))}.x"
        )
    return None
