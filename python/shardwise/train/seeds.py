"""The deterministic mode's randomness (``training.deterministic``): dropout seeded by (seed,
optimizer step, micro-batch, block), never by rank.

A forward pre-hook on each transformer block reseeds torch's generator with
``block_seed(seed, step, m, block)``: a block's masks depend neither on the rank that computes
micro-batch ``m`` nor on which blocks ran before it in this process, so a pipeline stage that
starts mid-model draws what the unpipelined model draws. Under activation checkpointing the
recomputation restores the generator state the hook left (torch.utils.checkpoint preserves it),
so the masks are recomputed alike.
"""

from __future__ import annotations

import functools

import torch
from torch import nn


def micro_batch_seed(seed: int, step: int, micro_batch: int) -> int:
    """The generator seed of micro-batch ``micro_batch`` of optimizer step ``step``."""
    return (seed * 1_000_003 + step * 65_537 + micro_batch) % (2**63)


def block_seed(seed: int, step: int, micro_batch: int, block: int) -> int:
    """The generator seed of transformer block ``block`` in that micro-batch."""
    return (micro_batch_seed(seed, step, micro_batch) * 4_099 + block) % (2**63)


class BlockSeeds:
    """Seeds each block of ``blocks`` in training mode from ``(seed, step, micro_batch)``. The
    step calls ``start`` before each micro-batch's forward (what runs before the first block,
    e.g. an embedding dropout, draws from ``micro_batch_seed``); a pipeline sets ``step`` and
    ``first`` per step call and gets ``before_stage_forward`` as its ``before_forward``."""

    def __init__(self, blocks: list[nn.Module], seed: int):
        self.seed, self.step, self.micro_batch, self.first = seed, 0, 0, 0
        self._hooks = [
            block.register_forward_pre_hook(functools.partial(self._seed, index))
            for index, block in enumerate(blocks)
        ]

    def start(self, step: int, micro_batch: int) -> None:
        """Micro-batch ``micro_batch`` (its global index) of optimizer step ``step`` begins."""
        self.step, self.micro_batch = step, micro_batch
        torch.manual_seed(micro_batch_seed(self.seed, step, micro_batch))

    def start_pipeline_call(self, step: int, first: int) -> None:
        """A pipeline step call of optimizer step ``step`` whose microbatch 0 is global
        micro-batch ``first``."""
        self.step, self.first = step, first

    def before_stage_forward(self, stage: int, microbatch: int) -> None:
        """The pipeline's ``before_forward``: microbatch ``microbatch`` of this step call (stage
        0 starts it, as the unpipelined forward does)."""
        if stage == 0:
            self.start(self.step, self.first + microbatch)
        self.micro_batch = self.first + microbatch

    def _seed(self, index: int, module: nn.Module, args) -> None:
        if module.training:
            torch.manual_seed(block_seed(self.seed, self.step, self.micro_batch, index))
