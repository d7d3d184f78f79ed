#!/usr/bin/env python3
"""Builds the DeepSpeed ops that the DeepSpeed and Accelerate tests load on the CPU accelerator
(its shared-memory communication op and FusedAdam), so that the tests find them built.

DeepSpeed compiles an op the first time a process loads it (torch.utils.cpp_extension.load, into
$TORCH_EXTENSIONS_DIR); here that is some 70-85 s of the first DeepSpeed test's time when the
folder is empty. This script takes the same path the tests take (the accelerator's op builder,
the same sources and flags), so a test then loads the op in about a second; a test that finds the
build still running waits on cpp_extension's lock for it. `make test` runs it at idle priority
beside test-python (scripts/later_builds.py).

Run with the dev venv's Python: python scripts/build_deepspeed_ops.py
"""

from __future__ import annotations

import os
import signal
import sys

OPS = ("ShareMemCommBuilder", "FusedAdamBuilder")


def main() -> int:
    # A SIGTERM (the lane stopped because make ended) unwinds instead of killing outright, so the
    # build's `finally` removes cpp_extension's lock file: a lock left behind makes every later
    # load of the op wait for a build that no longer runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.accelerator import get_accelerator

    for name in OPS:
        builder = get_accelerator().create_op_builder(name)
        if builder is None or not builder.is_compatible(verbose=False):
            print(f"{name}: not built on this machine (DeepSpeed says it is not compatible)")
            continue
        builder.load(verbose=False)
        print(f"{name}: built (or found built) as {builder.absolute_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
