"""torch FSDP's mixed-precision rules at module boundaries (``shardwise.fsdp.precision``),
without a process group: a full-precision module's inputs cast up and its outputs cast back,
buffers cast except a full-precision module's, and the modules torch's FSDP would run in full
precision found (with torch's warning). The training parity is tests/distributed."""

import pytest
import torch
from shardwise.fsdp import precision
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.ones(4))


def test_a_full_precision_module_computes_in_fp32_and_answers_in_the_input_dtype():
    """Catches: BatchNorm fed bf16 (torch's FSDP casts it up), or its output left in fp32 for
    the bf16 modules after it."""
    bn = nn.BatchNorm1d(4)
    seen = []
    precision.hook_full_precision(bn)
    bn.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))  # runs after
    out = bn(torch.randn(3, 4, dtype=torch.bfloat16))
    assert seen == [torch.float32] and out.dtype == torch.bfloat16
    assert bn.running_mean.dtype == torch.float32
    assert bn(torch.randn(3, 4)).dtype == torch.float32, "fp32 inputs: nothing to cast back"


def test_buffers_are_cast_except_a_full_precision_modules():
    """Catches: BatchNorm's running statistics rounded to bf16."""
    net = Net()
    precision.cast_buffers(net, torch.bfloat16, keep=["bn"])
    assert net.scale.dtype == torch.bfloat16
    assert net.bn.running_mean.dtype == torch.float32
    assert net.bn.num_batches_tracked.dtype == torch.long


def test_full_precision_modules_are_found_with_torchs_warning():
    """Catches: the override applied without a compute dtype, or silently."""
    policy = precision.Precision(torch.bfloat16, full_precision_classes=(nn.BatchNorm1d,))
    with pytest.warns(UserWarning, match="mixed precision disabled"):
        assert precision.full_precision_modules(Net(), policy) == ["bn"]
    assert precision.full_precision_modules(Net(), policy._replace(param_dtype=None)) == []


def test_unit_inputs_are_cast_when_asked():
    """Catches: cast_forward_inputs read and ignored."""
    lin = nn.Linear(4, 4).to(torch.bfloat16)
    precision.hook_unit_inputs(lin, torch.bfloat16)
    assert lin(torch.randn(2, 4)).dtype == torch.bfloat16
