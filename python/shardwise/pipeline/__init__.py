"""Pipeline parallelism (C++: ``csrc/pipeline/``): schedules generated and validated in C++, and
the C++ executor running this rank's stages. This module only adapts: it cuts a batch into
microbatches and hands nn.Modules and a loss function to the executor."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .. import _C

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def make_schedule(kind: str, num_ranks: int, num_microbatches: int, virtual_stages: int = 1):
    """The schedule (per rank, its ordered actions), already validated by simulation."""
    return _C.make_pipeline_schedule(kind, num_ranks, num_microbatches, virtual_stages)


def validate(schedule, forward: float = 1.0, backward: float = 2.0, buffered_sends: bool = True):
    """Simulates every rank: ok/error, makespan, bubble fraction, peak stashed microbatches."""
    return _C.validate_pipeline_schedule(schedule, forward, backward, buffered_sends)


def split_by_parameters(blocks: Sequence[nn.Module], num_stages: int) -> list[list[int]]:
    """Contiguous groups of block indices, one per stage, balancing parameter counts (each
    stage gets at least one block): a greedy cut at the running-total quantiles."""
    if num_stages < 1 or num_stages > len(blocks):
        raise ValueError(
            f"num_stages {num_stages}: need 1 <= num_stages <= number of blocks ({len(blocks)})"
        )
    sizes = [sum(p.numel() for p in b.parameters()) or 1 for b in blocks]
    total, cuts, running = sum(sizes), [], 0
    for i, size in enumerate(sizes):
        running += size
        left_blocks = len(sizes) - i - 1
        left_stages = num_stages - len(cuts) - 1
        due = running >= total * (len(cuts) + 1) / num_stages
        if left_stages > 0 and (due or left_blocks == left_stages):
            cuts.append(i + 1)
    bounds = [0, *cuts, len(blocks)]
    return [list(range(bounds[k], bounds[k + 1])) for k in range(num_stages)]


class Pipeline:
    """Runs ``stages`` (this rank's stage modules, keyed by stage index) under a schedule.

    ``loss_fn(output, target)`` is applied on the last stage per microbatch; ``step(inputs,
    targets)`` cuts both into the schedule's microbatches and returns the mean loss (on the
    rank of the last stage; 0 elsewhere). Gradients accumulate into the stage modules' ``.grad``.
    """

    def __init__(
        self,
        stages: dict[int, nn.Module],
        schedule,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        *,
        group: dist.ProcessGroup | None = None,
        rank: int | None = None,
        before_last_backward: Callable[[], None] | None = None,
    ):
        if group is None and schedule.num_ranks > 1:
            group = dist.group.WORLD
        self.rank = rank if rank is not None else (dist.get_rank(group) if group else 0)
        self.schedule = schedule
        self.stages = stages
        self._targets: list[torch.Tensor] = []
        ids = sorted(stages)
        self._executor = _C.PipelineExecutor(
            ids,
            [stages[i] for i in ids],
            schedule,
            self.rank,
            group,
            lambda output, i: loss_fn(output, self._targets[i]),
            before_last_backward,
        )
        self.last = None

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float:
        m = self.schedule.num_microbatches
        self._targets = list(targets.chunk(m)) if targets is not None else []
        chunks = list(inputs.chunk(m)) if inputs is not None else []
        for name, parts in (("inputs", chunks), ("targets", self._targets)):
            if parts and len(parts) != m:
                raise ValueError(
                    f"{name}: a batch of {len(parts)} rows cannot make {m} microbatches"
                )
        self.last = self._executor.step(chunks)
        return self.last["loss"]


__all__ = ["SCHEDULES", "Pipeline", "make_schedule", "split_by_parameters", "validate"]
