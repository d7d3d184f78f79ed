"""Activation checkpointing as shardwise-train applies it: each transformer block's forward runs
under ``torch.utils.checkpoint`` (non-reentrant), so backward recomputes the block's activations
from its input instead of keeping them. One rule, read by the trainer (``parallelize``) and by
the planner's trace (``gpt_costs``), so the planner measures the run's own recomputation."""

from __future__ import annotations

import torch


def checkpoint_blocks(blocks) -> None:
    """Wrap each block's ``forward`` (a Hugging Face layer takes more than the hidden states, so
    every argument passes through)."""
    for block in blocks:
        forward = block.forward
        block.forward = lambda *args, f=forward, **kwargs: torch.utils.checkpoint.checkpoint(
            f, *args, use_reentrant=False, **kwargs
        )
