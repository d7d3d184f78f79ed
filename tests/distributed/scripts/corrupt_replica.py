"""shardwise-train with one rank's copy of a replicated parameter corrupted: after step STEP,
rank RANK adds 1e-3 to the first element of parameter NAME (as a flipped bit in a rank's memory
would), then training goes on as configured.

    torchrun --nproc_per_node=2 corrupt_replica.py RANK STEP NAME --config ddp.yaml [overrides]
"""

import sys

import torch
from shardwise.train import cli, trainer

RANK, STEP, NAME = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
one_step = trainer.TrainingRun._one_step


def corrupting_step(self, *args):
    record = one_step(self, *args)
    if self.step == STEP and self.rank == RANK:
        with torch.no_grad():
            dict(self.stepper.par.gpt.named_parameters())[NAME].view(-1)[0] += 1e-3
    return record


trainer.TrainingRun._one_step = corrupting_step
sys.exit(cli.main(sys.argv[4:]))
