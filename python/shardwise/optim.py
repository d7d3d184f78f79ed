"""Drop-in optimizers whose step is fused C++ (``csrc/optim/``).

``FusedAdamW`` takes ``torch.optim.AdamW``'s arguments (amsgrad, maximize, foreach, capturable and
differentiable are not supported) and updates float32, contiguous parameters in one pass per
parameter; the result matches ``torch.optim.AdamW`` to within the rounding documented in
``csrc/optim/optim_math.h``. ``FusedLamb`` takes DeepSpeed's ``FusedLamb`` arguments
(``csrc/optim/lamb.h``: its two passes, the trust ratio per parameter). No arithmetic happens
here.
"""

import torch

from . import _C
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


class FusedLamb(torch.optim.Optimizer):
    """LAMB as DeepSpeed's ``FusedLamb`` (``csrc/optim/lamb.h``) on float32 parameters, each
    parameter's trust ratio ||param|| / ||direction|| clamped to [min_coeff, max_coeff].
    ``lamb_coeffs`` holds the last step's ratios (DeepSpeed's ``get_lamb_coeffs``).

    On shards: ``names`` maps each tensor (by ``id``) to the parameter it is a piece of; the
    ratio is then taken over each parameter's pieces, added up over ``group`` (the ranks holding
    its other pieces: FSDP's shard group) and, for the names in ``tp_split``, over ``tp_group``
    (tensor parallelism's). Every rank of those groups must hold pieces of the same parameters
    (possibly empty ones)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 eps_inside_sqrt=False, weight_decay=0.0, max_coeff=10.0, min_coeff=0.01, *,
                 names=None, group=None, tp_group=None, tp_split=()):  # fmt: skip
        defaults = {"lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
                    "eps_inside_sqrt": eps_inside_sqrt, "weight_decay": weight_decay,
                    "max_coeff": max_coeff, "min_coeff": min_coeff}  # fmt: skip
        super().__init__(params, defaults)
        self.lamb_coeffs: list[float] = []
        self._names, self._group, self._tp_group = names, group, tp_group
        self._rows = sorted(set(names.values())) if names is not None else None
        self._split_rows = [self._rows.index(n) for n in tp_split] if names is not None else []
        if names is not None and len(self.param_groups) != 1:
            raise ValueError("FusedLamb on shards (names=) takes one parameter group")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.lamb_coeffs = []
        for group in self.param_groups:
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
                buckets.setdefault((state["step"], p.grad.dtype, p.device), []).append(p)
            if self._rows is not None and len(buckets) > 1:
                raise ValueError(
                    "FusedLamb on shards: every piece must share one step count, gradient dtype "
                    "and device (the ranks step their rows together)"
                )
            for (step, _, _), params in buckets.items():
                self.lamb_coeffs.extend(self._step(group, step, params).tolist())
        return loss

    def _step(self, group: dict, step: int, params: list) -> torch.Tensor:
        beta1, beta2 = group["betas"]
        keys = ("lr", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "max_coeff",
                "min_coeff")  # fmt: skip
        hyper = {key: group[key] for key in keys}
        hyper.update(beta1=beta1, beta2=beta2, step=step, grad_scale=1.0)
        grads = [p.grad.contiguous() for p in params]
        m = [self.state[p]["exp_avg"] for p in params]
        v = [self.state[p]["exp_avg_sq"] for p in params]
        param_of = []
        if self._rows is not None:  # every row present on every rank: an empty last piece
            param_of = [self._rows.index(self._names[id(p)]) for p in params]
            empty = params[0].new_empty(0)
            params, grads = [*params, empty], [*grads, grads[0].new_empty(0)]
            m, v, param_of = [*m, empty], [*v, empty], [*param_of, len(self._rows) - 1]
        return _C.fused_lamb_(params, grads, m, v, [], hyper, param_of, self._group,
                              self._tp_group, self._split_rows)  # fmt: skip
