"""Counting what the collectives send: ``CommCounter``, a ``TorchDispatchMode`` that sees every
c10d and functional collective issued while it is on (from Python, from C++ through the
dispatcher, and DTensor's inner ones), per kind: calls, payload bytes and this rank's ring
traffic. The planner's communication model (``train/gpt_costs.py``) is checked against it."""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

COLLECTIVES = {  # dispatcher op -> kind
    "c10d.allreduce_": "all_reduce",
    "c10d._allgather_base_": "all_gather",
    "c10d.allgather_": "all_gather",
    "c10d.allgather_into_tensor_coalesced_": "all_gather",
    "c10d._reduce_scatter_base_": "reduce_scatter",
    "c10d.reduce_scatter_": "reduce_scatter",
    "c10d.reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d.broadcast_": "broadcast",
    "c10d.alltoall_base_": "all_to_all",
    "_c10d_functional.all_reduce": "all_reduce",
    "_c10d_functional.all_reduce_": "all_reduce",
    "_c10d_functional.all_reduce_coalesced": "all_reduce",
    "_c10d_functional.all_gather_into_tensor": "all_gather",
    "_c10d_functional.all_gather_into_tensor_out": "all_gather",
    "_c10d_functional.all_gather_into_tensor_coalesced": "all_gather",
    "_c10d_functional.reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional.reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_c10d_functional.all_to_all_single": "all_to_all",
    "_c10d_functional.broadcast": "broadcast",
}


def _own_dispatch(t: type) -> bool:
    """A tensor subclass with its own __torch_dispatch__ (DTensor), not nn.Parameter."""
    return (
        t is not torch.Tensor
        and issubclass(t, torch.Tensor)
        and t.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__
    )


class CommCounter(TorchDispatchMode):
    """Counts every collective issued while it is on: per kind, the number of calls, the
    payload bytes (all-reduce: the buffer; all-gather: the gathered output; reduce-scatter: the
    full input) and this rank's ring traffic (all-reduce 2(p-1)/p x payload, all-gather and
    reduce-scatter (p-1)/p x payload). ``group_size`` is p for c10d ops, whose group is opaque
    here; functional collectives carry theirs. Tensor subclasses (DTensor) are let through
    first, as torch's CommDebugMode does, so the collectives DTensor issues inside its own
    dispatch are seen too."""

    def __init__(self, group_size: int):
        super().__init__()
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self.calls: dict[str, int] = {}
        self.payload: dict[str, int] = {}
        self.wire: dict[str, float] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(_own_dispatch(t) for t in types):
            return NotImplemented
        out = func(*args, **kwargs)
        kind = COLLECTIVES.get(str(func.overloadpacket))
        if kind is not None:
            self._count(str(func.overloadpacket), kind, args, out)
        return out

    def _count(self, name, kind, args, out):
        if name.startswith("c10d."):  # (outputs, inputs, group, ...) or (tensors, group, ...)
            leaves = [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
            size = self.group_size
            payload = sum(t.nbytes for t in leaves)
            if kind in ("all_gather", "reduce_scatter"):  # the full side of in + out
                payload = payload * size // (size + 1)
        else:  # (input, [reduce_op], [group_size], group_name)
            sizes = [a for a in args[1:] if isinstance(a, int)]
            size = sizes[0] if sizes else self.group_size
            side = out if kind == "all_gather" else args[0]
            payload = sum(t.nbytes for t in pytree.tree_leaves(side) if isinstance(t, torch.Tensor))
        factor = 2 * (size - 1) / size if kind == "all_reduce" else (size - 1) / size
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.payload[kind] = self.payload.get(kind, 0) + payload
        self.wire[kind] = self.wire.get(kind, 0) + payload * factor

    @property
    def total_wire(self) -> float:
        return sum(self.wire.values())
