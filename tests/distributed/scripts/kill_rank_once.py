"""shardwise-train in which rank RANK dies (SIGKILL, as an out-of-memory kill or a lost host
would end it) right after step STEP of the job's first launch; the launches torchrun's
``--max-restarts`` starts after it train as configured, their rank 0 starting two seconds
after the others (hosts rarely start together; a rank that reads a dead launch's addresses
from torchrun's store before rank 0 writes its new one must not be let to).

    torchrun --max-restarts=1 --nproc_per_node=2 kill_rank_once.py RANK STEP --config x.yaml
"""

import os
import signal
import sys
import time

from shardwise.train import cli, trainer

RANK, STEP = int(sys.argv[1]), int(sys.argv[2])
FIRST_LAUNCH = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
one_step = trainer.TrainingRun._one_step


def dying_step(self, *args):
    record = one_step(self, *args)
    if FIRST_LAUNCH and self.step == STEP and self.rank == RANK:
        os.kill(os.getpid(), signal.SIGKILL)
    return record


trainer.TrainingRun._one_step = dying_step
if not FIRST_LAUNCH and os.environ["RANK"] == "0":
    time.sleep(2)
sys.exit(cli.main(sys.argv[3:]))
