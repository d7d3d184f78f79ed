"""Bytes per parameter of the training state, by precision and optimizer: the basis of every
per-rank memory figure (``planner.py``, ``gpt_costs.py``). Mixed precision keeps 2-byte
parameters and gradients beside fp32 master weights; Adam keeps two fp32 moments, SGD one.
"""

from __future__ import annotations

PRECISIONS = ("bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adam", "sgd")


def state_bytes_per_param(mixed_precision: str, optimizer: str) -> tuple[int, int, int]:
    """Bytes per parameter of (parameters, gradients, optimizer state), unsharded."""
    if mixed_precision not in PRECISIONS:
        raise ValueError(f"mixed_precision '{mixed_precision}'; valid: {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer '{optimizer}'; valid: {', '.join(OPTIMIZERS)}")
    moments = 4 if optimizer == "sgd" else 8  # fp32 momentum, or Adam's two moments
    if mixed_precision == "fp32":
        return 4, 4, moments
    return 2, 2, 4 + moments  # + fp32 master weights
