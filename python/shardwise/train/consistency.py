"""Cross-rank consistency of the replicated state ("silent data corruption: validate across
ranks"), every ``training.consistency_every`` steps.

What must be equal: a tensor slice that several ranks hold as copies of one another. Every
rank names what it holds as checkpoint slots do (``TrainStep.replicated_slots``: the tensor's
name in the plain model and the place of the slice in it), so copies have one key: DDP's and
ZeRO 1-2's parameters on every data rank, the AdamW moments beside them, the tp-replicated
norms on every tp rank, HSDP's shards on every replica. FSDP's and ZeRO-3's own shards have a
key of their own, and tp shards sit at their own places, so they are compared with nothing.

Each rank reduces each slice to a 64-bit checksum of its bits (``checksum``: every element's
bits times a weight that depends on its position, summed; an exact-equality test, not a
tolerance), the ranks gather them once (one ``all_gather_object``), and ``compare`` names the
first slice, in the holder's order, whose copies differ: which ranks hold which value (the
largest group first), and the step. Finding one stops the run or warns, as
``training.consistency_action`` says; the rank that differs is named on every rank."""

from __future__ import annotations

import torch

WEIGHT_PERIOD = 65521  # the largest prime below 2**16: weights 1..65521 by position

_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ConsistencyError(RuntimeError):
    """Copies of a replicated tensor differ across ranks."""


def checksum(view: torch.Tensor) -> int:
    """The slice's bits reduced to one int64 (wrapping), sensitive to values and positions."""
    flat = view.detach().contiguous().reshape(-1)
    bits = flat.view(_INTS[flat.element_size()]).to(torch.int64)
    weights = torch.arange(bits.numel(), device=bits.device) % WEIGHT_PERIOD + 1
    return int((bits * weights).sum().item())


def local_checksums(slots) -> dict[str, int]:
    """This rank's slices by key (name and place in the full tensor) -> checksum."""
    return {f"{s.name}[{s.start}:{s.start + s.view.numel()}]": checksum(s.view) for s in slots}


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def compare(gathered: list[dict[str, int]], step: int) -> str | None:
    """None when every slice's copies agree; else the first that does not, and who differs."""
    seen: set[str] = set()
    for holder in gathered:
        for key in holder:
            if key in seen:
                continue
            seen.add(key)
            values: dict[int, list[int]] = {}
            for rank, theirs in enumerate(gathered):
                if key in theirs:
                    values.setdefault(theirs[key], []).append(rank)
            if len(values) > 1:
                groups = sorted(values.values(), key=lambda ranks: (-len(ranks), ranks))
                others = "; ".join(_ranks(g) for g in groups[1:])
                verb = "differs" if len(groups) == 2 and len(groups[1]) == 1 else "differ"
                return (
                    f"step {step}: the copies of {key} differ across ranks: {others} "
                    f"{verb} from {_ranks(groups[0])} (replicated state must be bit-identical: "
                    "a rank's memory, device or data went wrong)"
                )
    return None
