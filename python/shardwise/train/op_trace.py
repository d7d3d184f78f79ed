"""What one training micro-batch asks of a device, operator by operator, traced on fake tensors.

A forward, the loss and the backward run under ``FakeTensorMode`` (shapes, dtypes and storages
as in a real run, no memory allocated), inside a dispatch mode that records every ATen operator
the run executes: its FLOPs (torch's own formulas, ``torch.utils.flop_counter.flop_registry``;
0 for an operator without one, such as an elementwise add) and the bytes it reads and writes
(its tensor inputs and outputs). Operators whose outputs alias an input (views: ``view``,
``transpose``, ``expand``, ...) move no memory and are left out, as torch's RuntimeEstimator
leaves them out. torch has no formula for the CPU flash attention; it gets the CUDA one's.
``step_time.py`` turns the record into seconds on a device (a roofline per operator, plus a
fixed cost per operator). The collectives the model itself calls (a tensor-parallel rank's
all-reduces, gathers and reduce-scatters: the c10d and functional operators of
``comm_count.COLLECTIVES``) are recorded apart, by kind and group size, and priced as
communication (``collective_latency.py``), not as compute.

torch's ``RuntimeEstimator`` does the same roofline, but reads the rates of the GPU it runs on
(it refuses to run without one), so it cannot price a cluster that is not here; this trace
keeps the operators and leaves the rates to a table (``calibration.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..comm_count import COLLECTIVES


@dataclass(frozen=True)
class OpCost:
    """One executed operator: its name, FLOPs, bytes read + written, the itemsize of its
    widest floating-point output (the dtype its matmul runs in) and, for a matmul, its smallest
    dimension (an attention's head size): small ones run far below a device's peak."""

    name: str
    flops: int
    bytes: int
    itemsize: int
    size: int = 0

    @property
    def kind(self) -> str:
        """``attention`` or ``attention_backward`` (a fused attention kernel, forward or
        backward: rates of their own), ``matmul`` (any other operator with a FLOP formula) or
        ``memory`` (bound by its bytes)."""
        if "attention" in self.name:
            return "attention_backward" if "backward" in self.name else "attention"
        return "matmul" if self.flops else "memory"


@dataclass(frozen=True)
class Trace:
    """The operators of one traced region, in execution order."""

    ops: tuple[OpCost, ...]
    # the collectives the traced region calls: (kind, ranks in its group), in order
    collectives: tuple[tuple[str, int], ...] = ()

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    @property
    def bytes(self) -> int:
        return sum(op.bytes for op in self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def roofline_seconds(
        self, rates, kinds=("matmul", "attention", "attention_backward", "memory")
    ) -> float:
        """Each operator of ``kinds`` at the slower of its FLOPs at ``rates.flop_rate(kind,
        itemsize, size)`` and its bytes at ``rates.memory_bytes_per_s`` (a
        ``calibration.DeviceRates``), summed."""
        return sum(
            max(
                op.flops / rates.flop_rate(op.kind, op.itemsize, op.size),
                op.bytes / rates.memory_bytes_per_s,
            )
            for op in self.ops
            if op.kind in kinds
        )

    def bytes_of(self, kind: str) -> int:
        return sum(op.bytes for op in self.ops if op.kind == kind)


# Operators that alias their input without an alias annotation in their schema.
_FREE = {"aten._unsafe_view", "aten.lift_fresh", "aten.detach"}


def _moves_nothing(func, outputs) -> bool:
    """Views (an output aliasing an input, not written: ``add_`` writes its alias and counts),
    the aliasing operators above, and queries that return no tensor (``prim.device``)."""
    if str(func._overloadpacket) in _FREE:
        return True
    if any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
        return True
    return not any(isinstance(t, torch.Tensor) for t in outputs)


def _size(name: str, args) -> int:
    """A matmul's smallest dimension (m, k or n); an attention's positions x head size (its
    query's last two dimensions: the CPU kernel's rate follows their product)."""
    tensors = [t for t in args if isinstance(t, torch.Tensor)]
    if "attention" in name:
        query = tensors[1] if name.endswith("_backward") else tensors[0]  # after grad_out
        return int(query.shape[-2] * query.shape[-1])
    if len(tensors) >= 2 and tensors[-1].dim() >= 2 and tensors[-2].dim() >= 2:
        a, b = tensors[-2].shape, tensors[-1].shape  # addmm's bias comes first
        return int(min(a[-2], a[-1], b[-1]))
    return 0


def _cpu_attention_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _cpu_attention_backward_flops(grad_out, query, key, value, *args, out_val=None, **kwargs):
    return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


# torch's formulas, plus the CPU flash attention's (the same as the CUDA one's; torch has none)
_FLOPS = {
    **{str(packet): formula for packet, formula in flop_registry.items()},
    "aten._scaled_dot_product_flash_attention_for_cpu": _cpu_attention_flops,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward": _cpu_attention_backward_flops,
}


def _tensor_bytes(values) -> int:
    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


def _group_size(args) -> int:
    """The ranks of the process group among a collective's arguments: a c10d operator's
    group, or a functional collective's group name."""
    from torch.distributed import ProcessGroup
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject) and a._type().name() == "ProcessGroup":
            return ProcessGroup.unbox(a).size()
    names = [a for a in args if isinstance(a, str)]
    if names:
        return _resolve_process_group(names[-1]).size()
    raise ValueError("a collective without its process group")


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[OpCost] = []
        self.collectives: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func._overloadpacket)
        if name in COLLECTIVES:
            self.collectives.append((COLLECTIVES[name], _group_size(args)))
            return out
        outputs, _ = tree_flatten(out)
        if _moves_nothing(func, outputs):
            return out
        formula = _FLOPS.get(name)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
        inputs, _ = tree_flatten((args, kwargs))
        # the dtype it computes in: a FLOP operator's first floating input's (flash attention
        # also takes and returns an fp32 logsumexp), another's widest output's (a cast writes
        # its new dtype)
        measured = [t for t in (args if flops else outputs) if isinstance(t, torch.Tensor)]
        floats = [t.element_size() for t in measured if t.is_floating_point()]
        floats = [s for s in floats if s in (2, 4, 8)][: 1 if flops else None] or [4]
        moved = _tensor_bytes(inputs) + _tensor_bytes(outputs)
        self.ops.append(OpCost(name, flops, moved, max(floats), _size(name, args) if flops else 0))
        return out


def trace(run: Callable[[], None]) -> Trace:
    """The operators ``run()`` executes; call it under ``FakeTensorMode`` to allocate nothing
    (``trace_training_step`` does)."""
    recorder = _Recorder()
    with recorder:
        run()
    return Trace(tuple(recorder.ops), tuple(recorder.collectives))


def build_with_parameters(build_model, dtype: torch.dtype | None):
    """``build_model()`` with its parameters created in ``dtype`` (torch's default dtype for
    the call; None: as built). Not ``model.to(dtype)``: fake parameters cannot be swapped."""
    if dtype is None:
        return build_model()
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return build_model()
    finally:
        torch.set_default_dtype(before)


def trace_training_step(
    build_model,
    tokens_shape: tuple[int, int],
    bf16: bool,
    backward: bool = True,
    low_params: bool = False,
) -> Trace:
    """One micro-batch of training on fake tensors: ``build_model()`` (called under the fake
    mode, so its parameters are fake too), its ``loss(tokens, tokens)`` under bf16 autocast when
    ``bf16``, and the backward (not with ``backward=False``: the forward alone, what activation
    checkpointing runs again). ``low_params``: the parameters themselves in bf16 and no autocast
    (what ZeRO and FSDP's mixed precision run: every operator in bf16). The optimizer step is
    not in it (``step_time.py`` prices it from
    the rank's share of the parameters)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = build_with_parameters(build_model, torch.bfloat16 if low_params else None)
        tokens = torch.zeros(tokens_shape, dtype=torch.long)

        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and not low_params):
                loss = model.loss(tokens, tokens)
            if backward:
                loss.backward()

        return trace(run)
