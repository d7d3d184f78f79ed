"""The cross-rank consistency check's rule (``shardwise.train.consistency``): the checksum sees
any changed bit and any moved element, and ``compare`` names the first replicated slice whose
copies differ, which ranks differ from which, and the step; slices held by some ranks only are
compared among their holders. The check in a training run: tests/distributed/test_train_keys.py."""

from __future__ import annotations

import torch
from shardwise.pieces import Slot
from shardwise.train import consistency


def test_the_checksum_sees_one_bit_and_one_swap():
    """Catches a checksum blind to a last-bit flip, to two elements trading places, or to the
    dtype's bits (bf16, int64)."""
    x = torch.randn(1000)
    base = consistency.checksum(x)
    flipped = x.clone()
    flipped.view(torch.int32)[500] ^= 1
    swapped = x.clone()
    swapped[[3, 7]] = swapped[[7, 3]]
    assert consistency.checksum(flipped) != base and consistency.checksum(swapped) != base
    assert consistency.checksum(x.clone()) == base
    half = x.to(torch.bfloat16)
    nudged = half.clone()
    nudged.view(torch.int16)[0] += 1
    assert consistency.checksum(half) != consistency.checksum(nudged)
    assert consistency.checksum(torch.arange(5)) != consistency.checksum(torch.arange(5).flip(0))


def _ranks(values: dict[int, dict[str, torch.Tensor]]) -> list[dict[str, int]]:
    return [
        consistency.local_checksums([Slot(n, 0, t) for n, t in held.items()])
        for _, held in sorted(values.items())
    ]


def test_compare_names_the_slice_the_ranks_and_the_step():
    """Catches a difference not found, or named without the ranks that differ (the largest
    group first) or the step."""
    w, b = torch.randn(6), torch.randn(3)
    bad = w.clone()
    bad[2] += 1e-3
    gathered = _ranks({0: {"w": w, "b": b}, 1: {"w": w, "b": b}, 2: {"w": bad, "b": b},
                       3: {"w": w, "b": b}})  # fmt: skip
    problem = consistency.compare(gathered, step=7)
    assert problem.startswith("step 7: the copies of w[0:6] differ across ranks: rank 2 differs")
    assert "from ranks 0, 1, 3" in problem
    assert consistency.compare(_ranks({0: {"w": w}, 1: {"w": w}}), step=1) is None


def test_slices_held_by_some_ranks_are_compared_among_their_holders():
    """Catches shards (keys of their own) reported as differing, and a slice two of four ranks
    hold (an HSDP shard, a pipeline stage's parameter) left unchecked."""
    a, b = torch.randn(4), torch.randn(4)
    gathered = _ranks({0: {"s0": a}, 1: {"s1": b}, 2: {"s0": a}, 3: {"s1": b}})
    assert consistency.compare(gathered, step=1) is None
    gathered = _ranks({0: {"s0": a}, 1: {"s1": b}, 2: {"s0": a}, 3: {"s1": a}})
    assert "s1[0:4] differ across ranks: rank 3 differs from rank 1" in consistency.compare(
        gathered, step=1
    )
