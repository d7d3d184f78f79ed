"""Fused multi-tensor AdamW and SGD steps on float32 parameters (C++: ``csrc/optim/``).

One pass per parameter reads the gradient (float32, bfloat16 or float16), updates the parameter
and optimizer state in place, and optionally writes the updated parameter rounded to
bfloat16/float16 into ``low_precision``. The arithmetic follows ``torch.optim.AdamW`` /
``torch.optim.SGD`` operation by operation (``csrc/optim/optim_math.h``). These wrappers and fake
kernels do no work of their own.
"""

import torch


def fused_adamw_(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    low_precision=(),
    *,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    step: int,
    grad_scale: float = 1.0,
) -> None:
    """One AdamW step; ``step`` counts from 1 (increment before each call, as torch does)."""
    if len(params) == 0:  # the dispatcher needs a tensor to pick a device
        return
    torch.ops.shardwise.fused_adamw_.default(
        list(params),
        list(grads),
        list(exp_avgs),
        list(exp_avg_sqs),
        list(low_precision),
        lr,
        beta1,
        beta2,
        eps,
        weight_decay,
        step,
        grad_scale,
    )


def fused_sgd_(
    params,
    grads,
    momentum_buffers=(),
    low_precision=(),
    *,
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    first_step: bool = False,
    grad_scale: float = 1.0,
) -> None:
    """One SGD step; with ``first_step`` the momentum buffers are set to the gradient (torch's
    first step); ``momentum_buffers`` is empty when ``momentum == 0``."""
    if len(params) == 0:
        return
    torch.ops.shardwise.fused_sgd_.default(
        list(params),
        list(grads),
        list(momentum_buffers),
        list(low_precision),
        lr,
        momentum,
        dampening,
        weight_decay,
        nesterov,
        first_step,
        grad_scale,
    )


@torch.library.register_fake("shardwise::fused_adamw_")
def _fused_adamw_fake(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    low_precision,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    step,
    grad_scale=1.0,
):
    return None


@torch.library.register_fake("shardwise::fused_sgd_")
def _fused_sgd_fake(
    params,
    grads,
    momentum_buffers,
    low_precision,
    lr,
    momentum,
    dampening,
    weight_decay,
    nesterov,
    first_step,
    grad_scale=1.0,
):
    return None


@torch.library.register_fake("shardwise::fused_lamb_moments_")
def _fused_lamb_moments_fake(
    params, grads, exp_avgs, exp_avg_sqs, beta1, beta2, eps, weight_decay,
    eps_inside_sqrt=False, grad_scale=1.0,
):  # fmt: skip
    return params[0].new_empty((len(params), 2), dtype=torch.float64)


@torch.library.register_fake("shardwise::fused_lamb_apply_")
def _fused_lamb_apply_fake(
    params, exp_avgs, exp_avg_sqs, low_precision, scaled_steps, beta1, beta2, eps, weight_decay,
    eps_inside_sqrt=False,
):  # fmt: skip
    return None
