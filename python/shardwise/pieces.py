"""World-size-independent checkpoint pieces (the copying is C++: ``sharding/checkpoint_pieces.h``).

Every strategy saves what its rank holds as *pieces*: ``(name, start, values)``, where ``values``
are elements ``[start, start + len(values))`` of the flattened full tensor ``name`` (a parameter
by its name in the plain GPT, or ``name + ":exp_avg"`` / ``":exp_avg_sq"`` for its AdamW
moments). A replicated tensor is one piece starting at 0; an FSDP shard is the piece its rank
owns. Loading never asks how the pieces were cut: every rank reads the pieces of every saved rank
and copies, into each tensor slice it now owns, the overlap of every piece of that name. So a run
of any strategy and world size loads a checkpoint of any other (the ZeRO optimizer's own pieces
in ``csrc/zero/`` follow the same rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Slot:
    """A slice this rank owns: elements [start, start + view.numel()) of tensor ``name``."""

    name: str
    start: int
    view: torch.Tensor  # 1-D, writable, the rank's storage of that slice
    tp_split: bool = False  # a tensor-parallel shard's piece (else the same on every tp rank)


def to_pieces(slots: list[Slot], copy: bool = True) -> list[dict]:
    """The slots as plain, weights_only-loadable pieces (clones in their dtype; with
    ``copy=False`` the live views, for a caller that copies them itself, as the asynchronous
    checkpoint writer does, to host memory)."""
    return [
        {"name": s.name, "start": int(s.start),
         "values": s.view.detach().clone() if copy else s.view.detach()}
        for s in slots
    ]  # fmt: skip


def fill(slots: list[Slot], pieces: list[dict], strict: bool = True) -> None:
    """Copies into every slot the overlapping elements of the pieces of its name (C++:
    ``sharding/checkpoint_pieces.h``). With ``strict``, an element no piece covers is a
    ValueError naming the tensor and the range."""
    from . import _C

    _C.fill_from_pieces(
        [(s.name, int(s.start), s.view) for s in slots],
        [(p["name"], int(p["start"]), p["values"]) for p in pieces],
        strict,
    )
