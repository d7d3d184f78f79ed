import pytest
import shardwise
import torch

ISAS = ["scalar", "avx512", "avx512_bf16"]
AVAILABLE_ISAS = ISAS[: ISAS.index(shardwise.detected_cpu_isa()) + 1]

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(params=AVAILABLE_ISAS)
def cpu_isa(request):
    """Runs a test once per CPU instruction set this machine has, restoring the default after."""
    shardwise.set_cpu_isa(request.param)
    yield request.param
    shardwise.set_cpu_isa(None)
