"""The fused AdamW / SGD ops against torch.optim over 20 steps.

Exactness: the fused kernels follow torch's CPU float32 arithmetic operation by operation
(csrc/optim/optim_math.h), but torch's ``exp_avg_sq.sqrt()`` goes through MKL's vector sqrt, which
is not correctly rounded (one ulp off for ~17% of inputs on the machine this was written on),
while ours is IEEE sqrt. So:
- against the same torch ops with a correctly rounded sqrt (``reference_adamw``): bit-exact, which
  checks every other operation and its order;
- against torch.optim.AdamW (foreach=False and True): exp_avg and exp_avg_sq bit-exact (the sqrt
  does not feed them), param within PARAM_ATOL (see there). SGD has no sqrt and is bit-exact.
"""

import pytest
import shardwise
import torch
from conftest import requires_cuda
from shardwise.ops import optim as ops
from shardwise.optim import FusedAdamW

SIZES = [1, 15, 17, 1003, 4099]
HP = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1}
STEPS = 20
# A one-ulp denom changes that step's update (|update| <= ~3 lr) by about one ulp of the update,
# which can flip param's rounding by one ulp of param (|param| < 4 here: 2^-22 at most); those
# flips reach later steps only through param (decay < 1), so they add up over STEPS steps at worst
# and in practice cancel: measured at most 2 ulps of 1.0 (2.4e-7). 4 ulps of 1.0 leaves room while
# a wrong operation (an error of order lr * 2^-10 or more) would fail.
PARAM_ATOL = 4 * 2**-23


def tensors(sizes, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=g) * scale).to(dtype) for n in sizes]


def grads_per_step(sizes, dtype=torch.float32):
    return [tensors(sizes, 100 + s, dtype) for s in range(STEPS)]


def assert_bits(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and torch.equal(x.view(torch.int16), y.view(torch.int16))


def torch_adamw(params0, grads, foreach, scale=1.0):
    params = [p.clone() for p in params0]
    opt = torch.optim.AdamW(
        params,
        lr=HP["lr"],
        betas=(HP["beta1"], HP["beta2"]),
        eps=HP["eps"],
        weight_decay=HP["weight_decay"],
        foreach=foreach,
    )
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.float() * scale if scale != 1.0 else g.float()
        opt.step()
    state = [opt.state[p] for p in params]
    return params, [s["exp_avg"] for s in state], [s["exp_avg_sq"] for s in state]


def reference_adamw(params0, grads):
    """torch.optim.AdamW's single-tensor steps, op for op, with a correctly rounded sqrt."""
    params = [p.clone() for p in params0]
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    lr, beta1, beta2 = HP["lr"], HP["beta1"], HP["beta2"]
    for step, step_grads in enumerate(grads, start=1):
        for p, g, m, v in zip(params, step_grads, exp_avgs, exp_avg_sqs, strict=True):
            g = g.float()
            p.mul_(1 - lr * HP["weight_decay"])
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            sqrt = v.double().sqrt().float()  # sqrt in double, rounded once: correctly rounded
            denom = (sqrt / bias_correction2_sqrt).add_(HP["eps"])
            p.addcdiv_(m, denom, value=-(lr / (1 - beta1**step)))
    return params, exp_avgs, exp_avg_sqs


def fused_adamw(params0, grads, low_dtype=None, grad_scale=1.0, device="cpu"):
    params = [p.clone().to(device) for p in params0]
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    low = [torch.empty_like(p, dtype=low_dtype) for p in params] if low_dtype else []
    for step, step_grads in enumerate(grads, start=1):
        ops.fused_adamw_(
            params,
            [g.to(device) for g in step_grads],
            exp_avgs,
            exp_avg_sqs,
            low,
            step=step,
            grad_scale=grad_scale,
            **HP,
        )
    return params, exp_avgs, exp_avg_sqs, low


def assert_close_to_torch(ours, theirs):
    params, exp_avgs, exp_avg_sqs = ours
    assert_bits(exp_avgs + exp_avg_sqs, theirs[1] + theirs[2])
    for a, b in zip(params, theirs[0], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=PARAM_ATOL)


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_adamw_matches_torch(cpu_isa, grad_dtype):
    params0 = tensors(SIZES, 0)
    grads = grads_per_step(SIZES, grad_dtype)
    ours = fused_adamw(params0, grads)[:3]
    assert_bits(ours[0] + ours[1] + ours[2], sum(reference_adamw(params0, grads), []))
    for foreach in (False, True):
        theirs = torch_adamw(params0, grads, foreach)
        assert_close_to_torch(ours, theirs)
        differing = sum(int((a != b).sum()) for a, b in zip(ours[0], theirs[0], strict=True))
        print(f"{cpu_isa} {grad_dtype} foreach={foreach}: {differing} params differ from torch")


def test_grad_scale_is_torch_on_scaled_grads(cpu_isa):
    params0 = tensors(SIZES, 0)
    grads = grads_per_step(SIZES)
    ours = fused_adamw(params0, grads, grad_scale=0.5)[:3]
    scaled = [[g * 0.5 for g in step] for step in grads]  # * 0.5 is exact here
    assert_bits(sum(ours, []), sum(reference_adamw(params0, scaled), []))
    assert_close_to_torch(ours, torch_adamw(params0, grads, foreach=False, scale=0.5))


@pytest.mark.parametrize("low_dtype", [torch.bfloat16, torch.float16])
def test_low_precision_copy_is_the_rounded_param(cpu_isa, low_dtype):
    params0 = tensors(SIZES, 0)
    params, _, _, low = fused_adamw(params0, grads_per_step(SIZES), low_dtype)
    assert_bits(low, [p.to(low_dtype) for p in params])
    plain = fused_adamw(params0, grads_per_step(SIZES))[0]
    assert_bits(params, plain)  # writing the copy changes nothing else


SGD_CASES = [
    {"momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False},
    {"momentum": 0.9, "dampening": 0.0, "weight_decay": 1e-2, "nesterov": False},
    {"momentum": 0.9, "dampening": 0.0, "weight_decay": 1e-2, "nesterov": True},
    {"momentum": 0.8, "dampening": 0.3, "weight_decay": 5e-3, "nesterov": False},
]


@pytest.mark.parametrize("case", SGD_CASES)
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_sgd_matches_torch_bit_for_bit(cpu_isa, case, grad_dtype):
    params0 = tensors(SIZES, 0)
    grads = grads_per_step(SIZES, grad_dtype)
    theirs = [p.clone() for p in params0]
    opt = torch.optim.SGD(theirs, lr=0.05, foreach=False, **case)
    ours = [p.clone() for p in params0]
    buffers = [torch.empty_like(p) for p in ours] if case["momentum"] else []
    low = [torch.empty_like(p, dtype=torch.bfloat16) for p in ours]
    for step, step_grads in enumerate(grads):
        for p, g in zip(theirs, step_grads, strict=True):
            p.grad = g.float()
        opt.step()
        ops.fused_sgd_(ours, step_grads, buffers, low, lr=0.05, first_step=step == 0, **case)
    assert_bits(ours, theirs)
    if case["momentum"]:
        assert_bits(buffers, [opt.state[p]["momentum_buffer"] for p in theirs])
    assert_bits(low, [p.to(torch.bfloat16) for p in ours])


def adamw_args(n=33, grad_dtype=torch.float32, low_dtype=torch.bfloat16):
    params = tensors([n, 7], 0)
    return (
        params,
        tensors([n, 7], 1, grad_dtype),
        [torch.zeros_like(p) for p in params],
        [torch.zeros_like(p) for p in params],
        [torch.empty_like(p, dtype=low_dtype) for p in params],
        1e-3,
        0.9,
        0.999,
        1e-8,
        0.01,
        3,
        0.5,
    )


def test_opcheck():
    torch.library.opcheck(torch.ops.shardwise.fused_adamw_.default, adamw_args())
    torch.library.opcheck(
        torch.ops.shardwise.fused_adamw_.default, adamw_args(grad_dtype=torch.bfloat16)
    )
    params = tensors([33, 7], 0)
    sgd_args = (
        params,
        tensors([33, 7], 1),
        [torch.zeros_like(p) for p in params],
        [],
        1e-2,
        0.9,
        0.0,
        1e-4,
        True,
        False,
        1.0,
    )
    torch.library.opcheck(torch.ops.shardwise.fused_sgd_.default, sgd_args)


def call_adamw(params, grads, exp_avgs, exp_avg_sqs, low=(), step=1):
    ops.fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, low, step=step, **HP)


def test_bad_arguments_name_the_argument_and_the_fix():
    p, g, m, v, low = adamw_args()[:5]
    with pytest.raises(ValueError, match=r"grads has 1 tensors but params has 2; pass one per"):
        call_adamw(p, g[:1], m, v)
    with pytest.raises(ValueError, match=r"exp_avgs\[1\] has 6 elements but its parameter has 7"):
        call_adamw(p, g, [m[0], m[1][:6]], v)
    with pytest.raises(TypeError, match=r"params\[0\] has dtype Double; it must be float32"):
        call_adamw([p[0].double(), p[1]], g, m, v)
    with pytest.raises(TypeError, match=r"grads\[1\] has dtype Int; gradients must be float32"):
        call_adamw(p, [g[0], g[1].int()], m, v)
    with pytest.raises(TypeError, match=r"grads\[1\] has dtype BFloat16 but grads\[0\] has Float"):
        call_adamw(p, [g[0], g[1].bfloat16()], m, v)
    with pytest.raises(ValueError, match=r"exp_avg_sqs\[0\] is not contiguous; pass contiguous"):
        call_adamw(p, g, m, [torch.zeros(66)[::2], v[1]])
    with pytest.raises(TypeError, match=r"low_precision\[0\] has dtype Float; the low-precision"):
        call_adamw(p, g, m, v, [torch.empty(33), low[1]])
    with pytest.raises(ValueError, match=r"low_precision has 1 tensors .* or an empty list"):
        call_adamw(p, g, m, v, low[:1])
    with pytest.raises(ValueError, match=r"step must be >= 1"):
        call_adamw(p, g, m, v, step=0)
    with pytest.raises(ValueError, match="momentum is 0, so momentum_buffers must be an empty"):
        ops.fused_sgd_(p, g, m, lr=0.1)
    with pytest.raises(ValueError, match="nesterov needs momentum > 0 and dampening == 0"):
        ops.fused_sgd_(p, g, m, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    assert torch.equal(p[0], adamw_args()[0][0])  # errors come before any write


def test_fused_adamw_optimizer_matches_torch_adamw_on_a_training_loop():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(9, 5), torch.nn.Linear(9, 5)
    theirs.load_state_dict(ours.state_dict())
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}
    opts = [
        FusedAdamW(ours.parameters(), **kwargs),
        torch.optim.AdamW(theirs.parameters(), **kwargs),
    ]
    x, y = torch.randn(64, 9), torch.randn(64, 5)
    for _ in range(STEPS):
        for model, opt in zip([ours, theirs], opts, strict=True):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        # Gradients depend on the parameters, so a one-ulp difference in one step changes later
        # gradients by a few ulps too; over 20 steps that stays far below 1e-5 relative.
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert opts[0].state[next(ours.parameters())]["step"] == STEPS


@requires_cuda
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu_bit_for_bit(grad_dtype):
    # IEEE sqrt, divide and the explicit fmaf are the same on both devices.
    params0 = tensors(SIZES, 0)
    grads = grads_per_step(SIZES, grad_dtype)
    cpu = fused_adamw(params0, grads, torch.bfloat16)
    cuda = fused_adamw(params0, grads, torch.bfloat16, device="cuda")
    for a, b in zip(cpu, cuda, strict=True):
        assert_bits(a, [t.cpu() for t in b])


@requires_cuda
def test_cuda_sgd_matches_torch():
    params = tensors(SIZES, 0)
    ours = [p.cuda() for p in params]
    theirs = [p.cuda() for p in params]
    buffers = [torch.empty_like(p) for p in ours]
    opt = torch.optim.SGD(theirs, lr=0.05, momentum=0.9, weight_decay=1e-2, foreach=False)
    for step, step_grads in enumerate(grads_per_step(SIZES)):
        for p, g in zip(theirs, step_grads, strict=True):
            p.grad = g.cuda()
        opt.step()
        ops.fused_sgd_(
            ours,
            [g.cuda() for g in step_grads],
            buffers,
            lr=0.05,
            momentum=0.9,
            weight_decay=1e-2,
            first_step=step == 0,
        )
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
def test_grad_scaler_unscales_as_torch_does(device, bad):
    """The fp16 GradScaler's unscale (any strategy outside ZeRO) against torch.amp.GradScaler's
    on the same gradients, on CPU and CUDA: catches the overflow flag or the inverse scale made
    on another device than the gradients' (torch's kernel refuses CUDA gradients beside a CPU
    flag: shardwise-train's fp16 DDP step crashed so on a GPU), an unreported overflow, and an
    unscale that is not torch's to the bit."""
    from shardwise import _C

    g = torch.Generator().manual_seed(0)
    grads = [(torch.randn(n, generator=g) * 1024).to(device) for n in (7, 4096)]
    if bad is not None:
        grads[1][5] = bad
    ours = [t.clone() for t in grads]
    overflow = _C.GradScaler(initial_scale=1024.0).unscale_(ours)

    params = [torch.nn.Parameter(torch.zeros_like(t)) for t in grads]
    for p, t in zip(params, grads, strict=True):
        p.grad = t.clone()
    opt = torch.optim.SGD(params, lr=0.0)
    theirs = torch.amp.GradScaler(device, init_scale=1024.0)
    theirs.scale(torch.ones((), device=device))  # the scale tensor torch's unscale_ reads
    theirs.unscale_(opt)
    theirs.update()  # backs the scale off after an overflow
    assert overflow == (theirs.get_scale() < 1024.0) == (bad is not None)
    for mine, p in zip(ours, params, strict=True):
        assert mine.device.type == device
        # the same kernel and inverse scale: bit-exact (a NaN stays a NaN)
        torch.testing.assert_close(mine, p.grad, rtol=0, atol=0, equal_nan=True)


def test_package_exports():
    assert shardwise.ops.optim.fused_adamw_ is ops.fused_adamw_
