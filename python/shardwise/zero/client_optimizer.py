"""DeepSpeed's *client optimizer*: a torch optimizer passed to ``deepspeed.initialize(optimizer=)``
(what Accelerate passes when the config has no ``optimizer`` section). DeepSpeed's ZeRO steps its
flat partitions with that optimizer's hyperparameters; shardwise steps them with its fused C++
AdamW or SGD, so the optimizer is read once, here, into the config's ``optimizer`` section, and
the engine then follows its ``lr`` (a torch scheduler on it keeps working: the engine reads
``param_groups[0]["lr"]`` before each step and writes it on ``set_lr``).

What maps: ``torch.optim.AdamW``; ``torch.optim.Adam`` (coupled weight decay, which the config
refuses unless ``weight_decay`` is 0, or ``decoupled_weight_decay=True``); ``torch.optim.SGD``
(momentum, dampening, nesterov, coupled weight decay as torch's). Refused with the fix: any other
type, ``amsgrad``, ``maximize``, and parameter groups whose hyperparameters differ (one set steps
every partition)."""

from __future__ import annotations

import torch

from ..fsdp.config import ConfigError

# hyperparameters that only pick torch's kernel: the fused C++ step runs instead
KERNEL_CHOICES = ("foreach", "fused", "capturable", "differentiable")
ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
SGD_KEYS = ("lr", "momentum", "dampening", "nesterov", "weight_decay")


def _value(value):
    return float(value) if isinstance(value, torch.Tensor) else value


def _hyperparameters(optimizer: torch.optim.Optimizer) -> dict:
    """The one hyperparameter set of every parameter group (groups that differ are refused)."""
    groups = [
        {k: _value(v) for k, v in g.items() if k != "params" and k not in KERNEL_CHOICES}
        for g in optimizer.param_groups
    ]
    for group in groups[1:]:
        differ = sorted(k for k in set(group) | set(groups[0]) if group.get(k) != groups[0].get(k))
        if differ:
            raise ConfigError(
                f"initialize: the optimizer's parameter groups differ in {', '.join(differ)}; "
                "shardwise's ZeRO steps every parameter with one set of hyperparameters: use one "
                "group (or describe the optimizer in the config's optimizer section)"
            )
    return groups[0]


def config_section(optimizer: torch.optim.Optimizer) -> dict:
    """The DeepSpeed config's ``optimizer`` section that steps as ``optimizer`` would."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"initialize: optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}"
        )
    given = _hyperparameters(optimizer)
    for flag in ("amsgrad", "maximize"):
        if given.get(flag):
            raise ConfigError(
                f"initialize: the optimizer's {flag}=True is not supported by shardwise's fused "
                f"step; drop {flag}"
            )
    if type(optimizer) is torch.optim.AdamW:
        return {"type": "AdamW", "params": {k: given[k] for k in ADAM_KEYS}}
    if type(optimizer) is torch.optim.Adam:
        decoupled = bool(given.get("decoupled_weight_decay", False))
        params = {k: given[k] for k in ADAM_KEYS}
        return {"type": "Adam", "params": {**params, "adam_w_mode": decoupled}}
    if type(optimizer) is torch.optim.SGD:
        return {"type": "SGD", "params": {k: given[k] for k in SGD_KEYS}}
    raise ConfigError(
        f"initialize: a {type(optimizer).__name__} optimizer is not supported; pass "
        "torch.optim.AdamW, Adam or SGD, or describe the optimizer in the config's optimizer "
        "section"
    )


def check_parameters(optimizer: torch.optim.Optimizer, trainable: set[int]) -> None:
    """The optimizer steps exactly the model's trainable parameters (anything else would train a
    different set silently)."""
    given = {id(p) for g in optimizer.param_groups for p in g["params"]}
    if given != trainable:
        raise ConfigError(
            "initialize: the optimizer must hold the model's trainable parameters, each once "
            "(shardwise's ZeRO steps all of them); freeze the others with requires_grad_(False)"
        )
