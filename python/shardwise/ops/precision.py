"""Mixed-precision casts: wrappers of the C++ ops and their fake kernels.

The rounding rules are in ``csrc/precision/cast_math.h``; autograd is registered in C++
(``csrc/precision/cast_autograd.cpp``), so LibTorch users get it too.
"""

import torch

from .. import _C

_SUPPORTED = {
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
}


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _direct(*tensors: torch.Tensor) -> bool:
    """Whether a call may take the op's direct entry (``shardwise._C``) instead of torch.ops.

    Both reach the same dispatcher entry, so autograd, devices, Python dispatch modes and
    ``__torch_dispatch__`` subclasses behave alike; the direct entry skips torch.ops' argument
    parsing (a few microseconds, which is most of a small cast's cost). torch.ops stays the path
    under torch.compile and wherever ``__torch_function__`` may intercept the call (a subclass,
    or a TorchFunctionMode), which only torch.ops honours.
    """
    return (
        all(type(t) in _PLAIN for t in tensors)
        and not torch._C._is_torch_function_mode_enabled()
        and not torch.compiler.is_compiling()
    )


def cast(input: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 -> bfloat16/float16 (round to nearest even), or bfloat16/float16 -> float32."""
    if _direct(input):
        return _C.cast(input, dtype)
    return torch.ops.shardwise.cast.default(input, dtype)


def cast_check_finite(input: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cast`` plus a 0-dim bool tensor, computed in the same pass: any output Inf or NaN."""
    if _direct(input):
        return _C.cast_check_finite(input, dtype)
    return torch.ops.shardwise.cast_check_finite.default(input, dtype)


def cast_stochastic_bf16(input: torch.Tensor, seed: int, offset: int = 0) -> torch.Tensor:
    """float32 -> bfloat16 with unbiased stochastic rounding, reproducible for (seed, offset).

    Element ``i`` draws its noise from counter ``offset + i``, so casting a tensor in pieces
    with matching offsets gives the bits of one call.
    """
    return torch.ops.shardwise.cast_stochastic_bf16.default(input, seed, offset)


def multi_cast_(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> torch.Tensor:
    """Casts ``inputs[i]`` into ``outputs[i]`` for every ``i`` in one call.

    Each output's dtype selects its conversion. Returns a 0-dim bool tensor: whether any output
    element is Inf or NaN. Empty lists are a no-op (the dispatcher needs a tensor to dispatch on).
    """
    if not inputs and not outputs:
        return torch.tensor(False)
    if _direct(*inputs, *outputs):
        return _C.multi_cast_(inputs, outputs)
    return torch.ops.shardwise.multi_cast_.default(inputs, outputs)


def _check_pair(op: str, src: torch.dtype, dst: torch.dtype) -> None:
    torch._check(
        (src, dst) in _SUPPORTED,
        lambda: f"{op}: cannot cast {src} to {dst}; supported: float32 <-> bfloat16/float16",
    )


@torch.library.register_fake("shardwise::cast")
def _cast_fake(input, dtype):
    _check_pair("shardwise.cast", input.dtype, dtype)
    return input.new_empty(input.shape, dtype=dtype)


@torch.library.register_fake("shardwise::cast_check_finite")
def _cast_check_finite_fake(input, dtype):
    _check_pair("shardwise.cast_check_finite", input.dtype, dtype)
    return input.new_empty(input.shape, dtype=dtype), input.new_empty((), dtype=torch.bool)


@torch.library.register_fake("shardwise::cast_stochastic_bf16")
def _cast_stochastic_bf16_fake(input, seed, offset=0):
    _check_pair("shardwise.cast_stochastic_bf16", input.dtype, torch.bfloat16)
    return input.new_empty(input.shape, dtype=torch.bfloat16)


@torch.library.register_fake("shardwise::multi_cast_")
def _multi_cast_fake(inputs, outputs):
    torch._check(
        len(inputs) == len(outputs),
        lambda: f"shardwise.multi_cast_: {len(inputs)} inputs but {len(outputs)} outputs",
    )
    for i, (src, dst) in enumerate(zip(inputs, outputs, strict=True)):
        torch._check(src.shape == dst.shape, lambda i=i: f"shape mismatch at index {i}")
        _check_pair("shardwise.multi_cast_", src.dtype, dst.dtype)
    device = inputs[0].device if inputs else torch.device("cpu")
    return torch.empty((), dtype=torch.bool, device=device)
