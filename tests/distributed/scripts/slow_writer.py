"""shardwise-train whose checkpoint writer takes SECONDS longer for every rank's file (as a slow
or contended filesystem would), to see whether training waits for it.

    torchrun --nproc_per_node=2 slow_writer.py SECONDS --config X [overrides]
"""

import sys
import time

from shardwise.train import checkpoint, cli

SECONDS = float(sys.argv[1])
atomic_write = checkpoint.atomic_write


def slow_atomic_write(path, write):
    time.sleep(SECONDS)
    return atomic_write(path, write)


checkpoint.atomic_write = slow_atomic_write
sys.exit(cli.main(sys.argv[2:]))
