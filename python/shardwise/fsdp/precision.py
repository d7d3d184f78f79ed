"""Mixed precision as torch FSDP's ``MixedPrecision`` defines it, for
``shardwise.FullyShardedDataParallel``.

The C++ engine does the numeric part of a unit's policy: it all-gathers and computes in
``param_dtype`` and reduces gradients in ``reduce_dtype``, keeping fp32 shards for the optimizer.
What happens around the units, at module boundaries, is here, with torch's rules and defaults:

- ``cast_root_forward_inputs`` (default True): the root casts its floating-point inputs to
  ``param_dtype``; ``cast_forward_inputs`` (default False): every unit does.
- ``buffer_dtype``: floating-point buffers are cast to it, except those of the modules below.
- ``_module_classes_to_ignore`` (default ``(_BatchNorm,)``): when units come from a wrap policy,
  each module of those classes becomes its own unit without mixed precision. Its parameters and
  buffers stay in full precision, its floating-point inputs are cast up to fp32, and its outputs
  are cast back to the input dtype. torch's FSDP does this, and warns that it does.
- ``keep_low_precision_grads`` (default False): True keeps the gradient shards the optimizer
  sees in ``param_dtype`` (the C++ unit allocates them so: half their memory under bf16) where
  False gives them the parameters' dtype. As in torch, the optimizer must accept low-precision
  gradients beside full-precision parameters (``torch.optim.SGD`` does).

When a unit's forward fails on mixed dtypes (an fp32 buffer added to bf16 activations, inputs
left in fp32), the error names the unit, the dtypes and the settings that fix it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.utils._pytree as pytree
from torch import nn

from .config import ConfigError


class Precision(NamedTuple):
    """One mixed-precision policy. The dtypes are None where the parameters' own dtype is kept.
    ``full_precision_classes`` are the module classes run as their own full-precision units."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    buffer_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True
    full_precision_classes: tuple[type[nn.Module], ...] = ()
    keep_low_precision_grads: bool = False


def from_torch(value) -> Precision:
    """torch's ``MixedPrecision`` as a ``Precision``, with torch's defaults."""
    if not hasattr(value, "param_dtype") or not hasattr(value, "keep_low_precision_grads"):
        raise ConfigError(
            f"mixed_precision {value!r}: pass torch.distributed.fsdp.MixedPrecision(...), or "
            "the param_dtype / reduce_dtype / buffer_dtype arguments"
        )
    return Precision(
        value.param_dtype,
        value.reduce_dtype,
        value.buffer_dtype,
        bool(value.cast_forward_inputs),
        bool(value.cast_root_forward_inputs),
        tuple(getattr(value, "_module_classes_to_ignore", ()) or ()),
        bool(value.keep_low_precision_grads),
    )


def full_precision_modules(root: nn.Module, precision: Precision) -> list[str]:
    """The submodules that run as their own full-precision units: those of
    ``precision.full_precision_classes``, when there is a compute dtype. Warns as torch does."""
    if precision.param_dtype is None or not precision.full_precision_classes:
        return []
    classes = precision.full_precision_classes
    names = [n for n, m in root.named_modules() if n and isinstance(m, classes)]
    if names:
        found = {type(root.get_submodule(n)) for n in names}
        warnings.warn(
            "Both mixed precision and an auto_wrap_policy were specified to FSDP, where the "
            f"wrapped module has submodules of type:\n{found}\nThese modules will be wrapped as "
            "separate FSDP instances with mixed precision disabled.",
            stacklevel=3,
        )
    return names


def cast_floats(dtype: torch.dtype | None, tree):
    """Every floating-point tensor in ``tree`` in ``dtype`` (None: unchanged)."""
    if dtype is None:
        return tree
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, tree
    )


def hook_unit_inputs(module: nn.Module, dtype: torch.dtype) -> None:
    """``cast_forward_inputs``: the unit's floating-point inputs arrive in ``dtype``."""
    module.register_forward_pre_hook(
        lambda _m, args, kwargs: cast_floats(dtype, (args, kwargs)), with_kwargs=True
    )


def hook_full_precision(module: nn.Module) -> None:
    """torch's override for a full-precision module: floating-point inputs cast up to fp32, the
    outputs cast back to the dtype the inputs came in (unchanged when no input was cast)."""
    came_in: list[torch.dtype] = []

    def before(_m, args):
        came_in.clear()
        for t in pytree.tree_leaves(args):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float32:
                came_in.append(t.dtype)
                break
        return cast_floats(torch.float32, args)

    def after(_m, _args, output):
        return cast_floats(came_in[0], output) if came_in else output

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)


def cast_buffers(root: nn.Module, dtype: torch.dtype | None, keep: list[str]) -> None:
    """Floating-point buffers in ``dtype``, except those of the modules named in ``keep`` (and
    their submodules), which stay in their own dtype."""
    if dtype is None:
        return
    for name, buffer in root.named_buffers():
        owner = name.rpartition(".")[0]
        if any(owner == k or owner.startswith(k + ".") for k in keep):
            continue
        if buffer.is_floating_point():
            buffer.data = buffer.data.to(dtype)


class MixedPrecisionError(RuntimeError):
    """A forward that failed on mixed dtypes, explained (the original error is its cause)."""


_MISMATCH = re.compile(r"dtype|scalar type", re.IGNORECASE)


def explain_dtype_errors(forward: Callable, unit: str, param_dtype: torch.dtype) -> Callable:
    """``forward``, its dtype-mismatch errors re-raised naming ``unit``, the dtypes and the fix."""

    def explained(*args, **kwargs):
        try:
            return forward(*args, **kwargs)
        except MixedPrecisionError:
            raise  # an inner unit's, already explained
        except RuntimeError as error:
            if not _MISMATCH.search(str(error)):
                raise
            leaves = pytree.tree_leaves((args, kwargs))
            got = sorted({str(t.dtype) for t in leaves if _is_float(t)}) or ["none"]
            short = str(param_dtype).removeprefix("torch.")
            raise MixedPrecisionError(
                f"{unit}: computes in {param_dtype} (mixed precision's param_dtype) but its "
                f"floating-point inputs are {', '.join(got)}, and the forward failed: {error}. "
                f"Fix: MixedPrecision(cast_forward_inputs=True) casts every unit's inputs to "
                f"{short}; MixedPrecision(buffer_dtype=torch.{short}) keeps buffers added to "
                "activations in the compute dtype; a module that must run in fp32 belongs in "
                "_module_classes_to_ignore"
            ) from error

    return explained


def _is_float(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()
