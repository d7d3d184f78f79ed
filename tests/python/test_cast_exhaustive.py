"""Every float32 bit pattern (2^32 of them) cast by shardwise and by ``Tensor.to``, bit for bit,
for bfloat16 and float16 and every CPU instruction set this machine has.

Chunks of 2^25 patterns keep memory at a few hundred MiB; the torch reference is computed once
per chunk and compared with each kernel.
"""

import pytest
import torch
from conftest import AVAILABLE_ISAS
from test_cast_ops import TORCH_VECTORIZED, bits

import shardwise

CHUNK = 1 << 25


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_all_float32_bit_patterns(dtype):
    mismatches = {isa: 0 for isa in AVAILABLE_ISAS}
    try:
        for low in range(-(2**31), 2**31, CHUNK):
            x = torch.arange(low, low + CHUNK, dtype=torch.int32).view(torch.float32)
            ref = bits(x.to(dtype))
            if not TORCH_VECTORIZED and dtype == torch.bfloat16:
                ref = torch.where(x.isnan(), -1, ref)  # 0xffff, see test_cast_ops
            for isa in AVAILABLE_ISAS:
                shardwise.set_cpu_isa(isa)
                mismatches[isa] += int((bits(shardwise.cast(x, dtype)) != ref).sum())
    finally:
        shardwise.set_cpu_isa(None)
    assert mismatches == {isa: 0 for isa in AVAILABLE_ISAS}
