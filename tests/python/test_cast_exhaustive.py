"""Every float32 bit pattern (2^32 of them) cast by shardwise and by PyTorch's conversion, bit for
bit, for bfloat16 and float16 and every CPU instruction set this machine has.

The reference is ``ref.copy_(x)``, the converting copy that ``Tensor.to`` runs after allocating.
Chunks of 2^18 patterns stay in cache, and every buffer is allocated once, so the whole sweep is
bounded by arithmetic rather than page faults.
"""

import pytest
import shardwise
import torch
from conftest import AVAILABLE_ISAS
from test_cast_ops import TORCH_VECTORIZED

CHUNK = 1 << 18


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_all_float32_bit_patterns(dtype):
    patterns = torch.empty(CHUNK, dtype=torch.int32)
    x = patterns.view(torch.float32)
    ref = torch.empty(CHUNK, dtype=dtype)
    ours = torch.empty(CHUNK, dtype=dtype)
    differ = torch.empty(CHUNK, dtype=torch.bool)
    bf16_nan_fixup = not TORCH_VECTORIZED and dtype == torch.bfloat16
    bad_chunks = {isa: [] for isa in AVAILABLE_ISAS}
    try:
        for low in range(-(2**31), 2**31, CHUNK):
            torch.arange(low, low + CHUNK, out=patterns)
            ref.copy_(x)
            if bf16_nan_fixup:  # torch's scalar path gives 0x7fc0; ours 0xffff (cast_math.h)
                ref.view(torch.int16).masked_fill_(x.isnan(), -1)
            for isa in AVAILABLE_ISAS:
                shardwise.set_cpu_isa(isa)
                shardwise.multi_cast_([x], [ours])
                torch.ne(ours.view(torch.int16), ref.view(torch.int16), out=differ)
                if differ.any():
                    bad_chunks[isa].append(hex(low & 0xFFFFFFFF))
    finally:
        shardwise.set_cpu_isa(None)
    assert bad_chunks == {isa: [] for isa in AVAILABLE_ISAS}
