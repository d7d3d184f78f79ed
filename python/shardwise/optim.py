"""Drop-in optimizers whose step is one fused C++ op (``csrc/optim/``).

``FusedAdamW`` takes ``torch.optim.AdamW``'s arguments (amsgrad, maximize, foreach, capturable and
differentiable are not supported) and updates float32, contiguous parameters in one pass per
parameter; the result matches ``torch.optim.AdamW`` to within the rounding documented in
``csrc/optim/optim_math.h``. No arithmetic happens here.
"""

import torch

from .ops.optim import fused_adamw_


class FusedAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) on float32 parameters through ``shardwise::fused_adamw_``."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # One call per (step count, gradient dtype, device): parameters that gained gradients
            # later have their own step counts, as in torch.optim.AdamW.
            buckets: dict[tuple, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                key = (state["step"], p.grad.dtype, p.device)
                buckets.setdefault(key, []).append(p)
            beta1, beta2 = group["betas"]
            for (step, _, _), params in buckets.items():
                fused_adamw_(
                    params,
                    [p.grad.contiguous() for p in params],
                    [self.state[p]["exp_avg"] for p in params],
                    [self.state[p]["exp_avg_sq"] for p in params],
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    step=step,
                )
        return loss
