"""The C++ safetensors writer (``csrc/checkpoint/safetensors.h``, which C++ programs export
their models with) read back by Hugging Face's own ``safetensors`` library."""

import pytest
import shardwise  # noqa: F401  (loads the extension)
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from shardwise import _C

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]  # fmt: skip


def test_every_dtype_and_shape_reads_back_exactly(tmp_path):
    """Catches: a wrong dtype name, byte offset, shape or byte order in the written file."""
    gen = torch.Generator().manual_seed(0)
    tensors = []
    for i, dtype in enumerate(DTYPES):
        shape = [(3, 5), (7,), (), (0, 4)][i % 4]
        values = torch.randn(shape, generator=gen) * 100
        tensors.append((f"t{i}.{dtype}".replace("torch.", ""), values.to(dtype)))
    tensors.append(("strided", torch.arange(12.0).reshape(3, 4).t()))  # not contiguous
    path = tmp_path / "model.safetensors"
    _C.save_safetensors(str(path), tensors, {"format": "pt", "step": "7"})
    loaded = load_file(str(path))
    assert set(loaded) == {name for name, _ in tensors}
    for name, tensor in tensors:
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt", "step": "7"}


def test_a_failed_save_keeps_the_previous_file(tmp_path):
    """Catches: a save that truncates the old file before it knows it can write the new one."""
    path = tmp_path / "model.safetensors"
    _C.save_safetensors(str(path), [("w", torch.ones(3))])
    before = path.read_bytes()
    with pytest.raises(Exception, match="'bad' has dtype"):
        _C.save_safetensors(
            str(path), [("w", torch.zeros(3)), ("bad", torch.zeros(2, dtype=torch.complex64))]
        )
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    with pytest.raises(Exception, match="cannot create .*missing"):
        _C.save_safetensors(str(tmp_path / "missing" / "m.safetensors"), [("w", torch.ones(1))])
