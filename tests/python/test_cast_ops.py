"""The casting ops against PyTorch's own conversions (``Tensor.to``), bit for bit.

No reduction happens in a cast, so every comparison is exact (bits, not tolerances); the one
documented difference is the bit pattern of bfloat16 NaN where torch's scalar fallback gives
0x7fc0 instead of its vectorised 0xffff (see csrc/precision/cast_math.h).
"""

import pytest
import shardwise
import torch
from conftest import requires_cuda

NARROW = [torch.bfloat16, torch.float16]
TORCH_VECTORIZED = torch.backends.cpu.get_cpu_capability() != "DEFAULT"


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same_bits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    if TORCH_VECTORIZED or ours.dtype != torch.bfloat16:
        torch.testing.assert_close(bits(ours), bits(ref), rtol=0, atol=0)
    else:  # torch's scalar bf16 NaN is 0x7fc0; ours is 0xffff
        nan = ref.isnan()
        torch.testing.assert_close(ours.isnan(), nan, rtol=0, atol=0)
        torch.testing.assert_close(bits(ours)[~nan], bits(ref)[~nan], rtol=0, atol=0)


EDGE_BITS = [
    0x00000000,
    0x80000000,
    0x00000001,
    0x80000001,
    0x007FFFFF,
    0x00800000,
    0x00400000,
    0x3F800000,
    0x3F808000,
    0x3F818000,
    0x3F807FFF,
    0x3F808001,
    0x7F7FFFFF,
    0xFF7FFFFF,
    0x7F7F8000,
    0x7F7F7FFF,
    0x7F800000,
    0xFF800000,
    0x7FC00000,
    0xFFC00000,
    0x7F800001,
    0xFF812345,
    0x7FFFFFFF,
    0x477FF000,
    0x477FEFFF,
    0x47800000,
    0x38800000,
    0x387FFFFF,
    0x33000000,
    0x33000001,
    0x33800000,
    0xB3C00000,
]  # zeros, denormals, RNE ties, FLT_MAX, Inf, NaN payloads, fp16 overflow/denormal bounds


def edge_tensor() -> torch.Tensor:
    return torch.tensor(EDGE_BITS, dtype=torch.int64).to(torch.int32).view(torch.float32)


def sample_inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    yield torch.randn(1000, generator=g).to(device)
    yield (torch.randn(33, 65, generator=g) * 1e4).to(device)  # odd sizes: masked tails
    yield edge_tensor().repeat(3).to(device)
    yield torch.randn(64, 48, generator=g).to(device).t()  # non-contiguous
    yield torch.randn(10, 20, generator=g).to(device)[::3, 1::2]  # strided slice
    yield torch.empty(0, device=device)
    yield torch.tensor(3.14159, device=device)  # 0-dim
    yield (torch.rand(3_000_017, generator=g) * 2e5 - 1e5).to(device)  # large, spans threads


@pytest.mark.parametrize("dtype", NARROW)
def test_narrowing_matches_to(cpu_isa, dtype):
    for x in sample_inputs():
        assert_same_bits(shardwise.cast(x, dtype), x.to(dtype))


@pytest.mark.parametrize("dtype", NARROW)
def test_widening_matches_to_on_all_16_bit_patterns(cpu_isa, dtype):
    narrow = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    assert_same_bits(shardwise.cast(narrow, torch.float32), narrow.to(torch.float32))
    strided = narrow[::7]
    assert_same_bits(shardwise.cast(strided, torch.float32), strided.to(torch.float32))


@pytest.mark.parametrize("dtype", NARROW)
def test_check_finite_flags_every_nonfinite_output(cpu_isa, dtype):
    x = torch.randn(4097)
    out, found = shardwise.cast_check_finite(x, dtype)
    assert_same_bits(out, x.to(dtype))
    assert found.dtype == torch.bool and found.dim() == 0 and not found.item()
    for position in [0, 15, 16, 2048, 4096]:
        for value in [float("inf"), float("-inf"), float("nan"), 1e30]:
            y = x.clone()
            y[position] = value
            out, found = shardwise.cast_check_finite(y, dtype)
            expected = bool(y.to(dtype).isinf().any() or y.to(dtype).isnan().any())
            assert found.item() == expected, (position, value)
            assert_same_bits(out, y.to(dtype))


def test_check_finite_widening(cpu_isa):
    h = torch.randn(100).to(torch.float16)
    assert not shardwise.cast_check_finite(h, torch.float32)[1].item()
    h[99] = float("inf")
    assert shardwise.cast_check_finite(h, torch.float32)[1].item()


def test_stochastic_rounding_is_reproducible_unbiased_and_between_neighbours(cpu_isa):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1 << 16, generator=g)
    a = shardwise.cast_stochastic_bf16(x, seed=7)
    assert torch.equal(bits(a), bits(shardwise.cast_stochastic_bf16(x, seed=7)))
    assert not torch.equal(bits(a), bits(shardwise.cast_stochastic_bf16(x, seed=8)))
    # Each result is the bf16 just below or just above x in magnitude (truncation or next).
    down = (bits(x) >> 16).to(torch.int16)
    assert bool(((bits(a) == down) | (bits(a) == down + 1)).all())
    # Pieces with matching offsets give the bits of one call.
    pieces = torch.cat(
        [
            shardwise.cast_stochastic_bf16(x[:1000], seed=7, offset=0),
            shardwise.cast_stochastic_bf16(x[1000:], seed=7, offset=1000),
        ]
    )
    assert torch.equal(bits(pieces), bits(a))
    # Unbiased: the mean of many roundings of one value converges to it. For 2^18 draws of
    # 1 + 0.3 ulp the standard error is sqrt(0.3 * 0.7 / 2^18) ulp ~ 9e-4 ulp; allow 6 sigma.
    ulp = 2.0**-7
    value = torch.full((1 << 18,), 1.0 + 0.3 * ulp)
    mean = shardwise.cast_stochastic_bf16(value, seed=3).double().mean().item()
    assert abs(mean - value[0].item()) < 6 * (0.3 * 0.7 / (1 << 18)) ** 0.5 * ulp
    # RNE would give a bias of -0.3 ulp here, which the bound above excludes.
    assert abs(shardwise.cast(value, torch.bfloat16).double().mean().item() - value[0]) > 0.29 * ulp


def test_stochastic_special_values(cpu_isa):
    x = edge_tensor()
    out = shardwise.cast_stochastic_bf16(x, seed=0)
    ref = x.to(torch.bfloat16)
    assert torch.equal(out.isnan(), ref.isnan())
    inf = x.isinf()
    assert torch.equal(bits(out)[inf], bits(ref)[inf])


def test_multi_cast_matches_individual_casts(cpu_isa):
    g = torch.Generator().manual_seed(2)
    inputs = [
        torch.randn(100, generator=g),
        torch.randn(7, 9, generator=g),
        torch.randn(200_000, generator=g),
        torch.empty(0),
        torch.randn(3, generator=g).to(torch.bfloat16),
        torch.randn(5, 4, generator=g).t(),
    ]
    outputs = [
        torch.empty(100, dtype=torch.bfloat16),
        torch.empty(7, 9, dtype=torch.float16),
        torch.empty(200_000, dtype=torch.bfloat16),
        torch.empty(0, dtype=torch.float16),
        torch.empty(3, dtype=torch.float32),
        torch.empty(5, 4, dtype=torch.bfloat16).t(),  # non-contiguous output
    ]
    found = shardwise.multi_cast_(inputs, outputs)
    assert not found.item()
    for x, out in zip(inputs, outputs, strict=True):
        assert_same_bits(out, x.to(out.dtype))
    inputs[2][12345] = float("nan")
    assert shardwise.multi_cast_(inputs, outputs).item()
    assert not shardwise.multi_cast_([], []).item()


def test_gradient_is_the_reverse_cast():
    x = torch.randn(50, requires_grad=True)
    for op in (
        lambda t: shardwise.cast(t, torch.bfloat16),
        lambda t: shardwise.cast_check_finite(t, torch.float16)[0],
        lambda t: shardwise.cast_stochastic_bf16(t, seed=1),
    ):
        x.grad = None
        y = op(x)
        upstream = torch.randn(50).to(y.dtype)
        y.backward(upstream)
        assert x.grad.dtype == torch.float32
        assert torch.equal(x.grad, upstream.float())
    h = torch.randn(20).to(torch.float16).requires_grad_()
    shardwise.cast(h, torch.float32).sum().backward()
    assert h.grad.dtype == torch.float16 and bool((h.grad == 1).all())


def test_gradcheck_through_a_widening_cast():
    x = torch.randn(8, dtype=torch.float32)
    h = x.to(torch.bfloat16).requires_grad_()
    y = shardwise.cast(h, torch.float32) * 3
    (g,) = torch.autograd.grad(y.sum(), h)
    assert torch.equal(g, torch.full_like(h, 3))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: shardwise.cast(torch.ones(2, dtype=torch.int32), torch.bfloat16), "'input'"),
        (lambda: shardwise.cast(torch.ones(2), torch.float64), "'dtype'"),
        (lambda: shardwise.cast(torch.ones(2, dtype=torch.bfloat16), torch.float16), "'dtype'"),
        (
            lambda: shardwise.cast_check_finite(torch.ones(2, dtype=torch.float64), torch.half),
            "'input'",
        ),
        (lambda: shardwise.cast_stochastic_bf16(torch.ones(2).half(), 0), "'input'"),
        (lambda: shardwise.cast_stochastic_bf16(torch.ones(2), 0, -1), "'offset'"),
        (lambda: shardwise.multi_cast_([torch.ones(2)], []), "'outputs' has 0"),
        (
            lambda: shardwise.multi_cast_([torch.ones(2)], [torch.empty(3, dtype=torch.half)]),
            "outputs[0] has shape",
        ),
        (
            lambda: shardwise.multi_cast_([torch.ones(2)], [torch.empty(2, dtype=torch.int8)]),
            "'outputs'",
        ),
        (
            lambda: shardwise.multi_cast_(
                [torch.ones(2), torch.ones(2)], [torch.empty(2).half(), torch.empty(2)]
            ),
            "outputs[1]",
        ),
    ],
)
def test_bad_arguments_raise_errors_naming_them(call, message):
    with pytest.raises((TypeError, ValueError, RuntimeError)) as info:
        call()
    assert message in str(info.value)


def test_cpu_isa_selection_rejects_unknown_names():
    with pytest.raises(ValueError, match="valid: scalar, avx512, avx512_bf16"):
        shardwise.set_cpu_isa("sse9")
    shardwise.set_cpu_isa(None)
    assert shardwise.active_cpu_isa() == shardwise.detected_cpu_isa()


def opcheck_samples(device):
    x = torch.randn(17, 5, device=device)
    yield torch.ops.shardwise.cast.default, (x, torch.bfloat16)
    yield torch.ops.shardwise.cast.default, (x.requires_grad_(), torch.float16)
    yield torch.ops.shardwise.cast.default, (x.detach().to(torch.bfloat16), torch.float32)
    yield torch.ops.shardwise.cast_check_finite.default, (x.detach(), torch.float16)
    yield torch.ops.shardwise.cast_stochastic_bf16.default, (x.detach().requires_grad_(), 5, 3)
    yield (
        torch.ops.shardwise.multi_cast_.default,
        (
            [x.detach(), x.detach()[:3]],
            [
                torch.empty(17, 5, dtype=torch.bfloat16, device=device),
                torch.empty(3, 5, dtype=torch.float16, device=device),
            ],
        ),
    )


def test_no_grad_casts_record_no_graph():
    """Catches the no-gradient shortcut of the C++ autograd kernel leaking: a cast of a tensor
    that needs no gradient (or under no_grad) must give a leaf without grad_fn, and a cast of
    one that does must still record the reverse cast."""
    x = torch.randn(8, requires_grad=True)
    with torch.no_grad():
        assert shardwise.cast(x, torch.bfloat16).grad_fn is None
        assert not shardwise.cast_check_finite(x, torch.float16)[0].requires_grad
    assert shardwise.cast_stochastic_bf16(x.detach(), seed=3).grad_fn is None
    assert shardwise.cast(x, torch.bfloat16).grad_fn is not None


def test_direct_entry_keeps_torch_function_and_dispatch_interception():
    """Catches the wrappers' direct entry (shardwise._C, which skips torch.ops' argument parsing)
    bypassing what torch.ops honours: a TorchFunctionMode must still see the op (the wrapper
    falls back to torch.ops), a TorchDispatchMode must see it through the direct entry, and a
    __torch_dispatch__ subclass (FakeTensor) must get the fake kernel's result."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record:
        def __init__(self):
            self.seen = []

    class FunctionMode(TorchFunctionMode, Record):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    class DispatchMode(TorchDispatchMode, Record):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.randn(16)
    out = torch.empty(16, dtype=torch.bfloat16)
    for mode, calls in (
        (
            FunctionMode(),
            [torch.ops.shardwise.cast.default, torch.ops.shardwise.multi_cast_.default],
        ),
        (
            DispatchMode(),
            [torch.ops.shardwise.cast.default, torch.ops.shardwise.multi_cast_.default],
        ),
    ):
        Record.__init__(mode)
        with mode:
            y = shardwise.cast(x, torch.bfloat16)
            shardwise.multi_cast_([x], [out])
        assert [f for f in mode.seen if f in calls] == calls, type(mode).__name__
        assert_same_bits(y, x.to(torch.bfloat16))
        assert_same_bits(out, x.to(torch.bfloat16))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as fake:
        f = fake.from_tensor(x)
        y = shardwise.cast(f, torch.bfloat16)
    assert type(y).__name__ == "FakeTensor" and y.dtype == torch.bfloat16 and y.shape == x.shape


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_opcheck(device):
    for op, args in opcheck_samples(device):
        torch.library.opcheck(op, args)


def test_torch_compile_fullgraph():
    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(w, g):
        w16 = shardwise.cast(w, torch.bfloat16)
        g16, found = shardwise.cast_check_finite(g, torch.float16)
        return w16, g16, found

    w, g = torch.randn(64), torch.randn(64)
    w16, g16, found = step(w, g)
    assert_same_bits(w16, w.to(torch.bfloat16))
    assert_same_bits(g16, g.to(torch.float16))
    assert not found.item()


@requires_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", NARROW)
def test_cuda_matches_cpu_kernels(dtype):
    """The CUDA kernels run the same per-element functions: bit-identical to the CPU op."""
    for x in sample_inputs("cuda"):
        ours = shardwise.cast(x, dtype)
        assert_same_bits(ours.cpu(), shardwise.cast(x.cpu(), dtype))
        assert_same_bits(
            shardwise.cast(ours, torch.float32).cpu(), shardwise.cast(ours.cpu(), torch.float32)
        )
        out, found = shardwise.cast_check_finite(x, dtype)
        assert found.device == x.device
    x = torch.randn(100_003, device="cuda")
    sr = shardwise.cast_stochastic_bf16(x, seed=11, offset=5)
    assert torch.equal(bits(sr.cpu()), bits(shardwise.cast_stochastic_bf16(x.cpu(), 11, 5)))
    outs = [
        torch.empty(100_003, dtype=dtype, device="cuda"),
        torch.empty(0, dtype=dtype, device="cuda"),
    ]
    assert not shardwise.multi_cast_([x, x[:0]], outs).item()
    assert_same_bits(outs[0].cpu(), shardwise.cast(x.cpu(), dtype))
    # Views starting off a 16-byte boundary take the kernels' element-by-element path.
    base = torch.randn(4099, device="cuda")
    for view in (base[1:], base[3:4003], base[8:]):
        assert_same_bits(shardwise.cast(view, dtype).cpu(), shardwise.cast(view.cpu(), dtype))
        sr = shardwise.cast_stochastic_bf16(view, seed=3, offset=7)
        assert torch.equal(bits(sr.cpu()), bits(shardwise.cast_stochastic_bf16(view.cpu(), 3, 7)))
    shifted = torch.empty(4100, dtype=dtype, device="cuda")[1:]
    shardwise.multi_cast_([base], [shifted])
    assert_same_bits(shifted.cpu(), shardwise.cast(base.cpu(), dtype))


@requires_cuda
@pytest.mark.cuda
def test_cuda_device_mismatch_is_an_error():
    with pytest.raises(RuntimeError, match="outputs\\[0\\] is on cpu"):
        shardwise.multi_cast_([torch.ones(2, device="cuda")], [torch.empty(2).half()])
