"""Atomic file writes: a reader sees the old file or the complete new one, never a torn one.

The data goes to a temporary file in the same directory, which is flushed and ``fsync``-ed, then
``os.replace``-d onto its name, and the directory is ``fsync``-ed; a failed write removes the
temporary file and re-raises. Training checkpoints (``shardwise.train.checkpoint``) and the ZeRO
engine's optimizer pieces (``shardwise.zero.engine``) are written this way.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem allows this
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_path(path: str | Path, write_to: Callable[[str], None]) -> None:
    """Calls ``write_to(tmp_path)`` for a temporary file next to ``path``, fsyncs it and renames
    it onto ``path``. On any exception the temporary file is removed and the exception re-raised."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_to(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def atomic_write(path: str | Path, write: Callable) -> None:
    """Like ``atomic_write_path`` but calls ``write(binary_file)``."""

    def write_to(tmp: str) -> None:
        with open(tmp, "wb") as f:
            write(f)

    atomic_write_path(path, write_to)
