"""LAMB (csrc/optim/lamb.h) against a reference LAMB written from DeepSpeed's FusedLamb kernel
(fused_lamb_cuda_kernel.cu) in plain torch, step for step."""

import pytest
import shardwise.optim
import torch

STEPS = 20
SHAPES = [(64, 32), (32,), (128, 3), (5,)]


def reference_lamb(params, grads, lr, betas, eps, weight_decay, max_coeff=10.0,
                   min_coeff=0.01, bias_correction=True, eps_inside_sqrt=False):  # fmt: skip
    """DeepSpeed's FusedLamb per parameter, in the parameters' dtype: the moments, the
    direction m / denom + weight_decay * p, the trust ratio ||p|| / ||direction|| clamped (1
    where either norm is 0), and p -= step_size * ratio * direction."""
    beta1, beta2 = betas
    params = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for step, step_grads in enumerate(grads, start=1):
        step_size = lr
        if bias_correction:
            step_size *= (1 - beta2**step) ** 0.5 / (1 - beta1**step)
        for p, g, mi, vi in zip(params, step_grads, m, v, strict=True):
            g = g.to(p.dtype)
            mi.mul_(beta1).add_(g, alpha=1 - beta1)
            vi.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (vi + eps).sqrt() if eps_inside_sqrt else vi.sqrt() + eps
            direction = mi / denom + weight_decay * p
            w, u = p.norm().item(), direction.norm().item()
            ratio = min(max(w / u, min_coeff), max_coeff) if w and u else 1.0
            p.sub_(step_size * ratio * direction)
    return params


def problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(STEPS)]
    params[3].zero_()  # zero and never a gradient: both norms 0, the ratio 1, it stays 0
    for step_grads in grads:
        step_grads[3].zero_()
    return params, grads


def run_fused(params0, grads, **hp):
    params = [p.clone().requires_grad_() for p in params0]
    opt = shardwise.optim.FusedLamb(params, **hp)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params], opt


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize(
    "hp",
    [
        {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
        {"lr": 5e-3, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.0,
         "bias_correction": False, "eps_inside_sqrt": True},
        {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1,
         "max_coeff": 0.5, "min_coeff": 0.1},
    ],
)  # fmt: skip
def test_fused_lamb_matches_the_reference_step_for_step(hp):
    """20 steps of FusedLamb against the reference in float32, both measured against the
    reference in float64: ours is within 2x the float32 reference's own error (the norms are
    sums in another order), on every parameter; one parameter and its gradients are 0 (ratio 1,
    it stays 0); in the third case the ratios are clamped at max_coeff and min_coeff."""
    params0, grads = problem()
    ours, opt = run_fused(params0, grads, **hp)
    f32 = reference_lamb(params0, grads, **hp)
    f64 = reference_lamb([p.double() for p in params0], grads, **hp)
    for i, (o, r, exact) in enumerate(zip(ours, f32, f64, strict=True)):
        if not exact.norm():
            continue
        assert _rel(o, exact) <= max(2 * _rel(r, exact), 1e-7), (i, _rel(o, exact), _rel(r, exact))
    assert len(opt.lamb_coeffs) == len(SHAPES) and opt.lamb_coeffs[3] == 1.0
    assert not ours[3].any()
    if "max_coeff" in hp:
        assert {0.5, 0.1} & set(opt.lamb_coeffs), opt.lamb_coeffs


def test_lamb_rejects_bad_hyperparameters_before_any_write():
    """A beta outside [0, 1) or min_coeff above max_coeff is a ValueError naming it, and the
    parameters are untouched."""
    params0, grads = problem()
    for hp, match in (({"betas": (1.0, 0.999)}, "beta1"),
                      ({"min_coeff": 2.0, "max_coeff": 1.0}, "min_coeff")):  # fmt: skip
        p = params0[0].clone().requires_grad_()
        p.grad = grads[0][0].clone()
        with pytest.raises(ValueError, match=match):
            shardwise.optim.FusedLamb([p], **hp).step()
        assert torch.equal(p.detach(), params0[0])


def test_opcheck():
    """Both passes as ops: schema, fake kernels, and no aliasing surprises."""
    params0, grads = problem()
    params = [p.clone() for p in params0]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    ops = torch.ops.shardwise
    torch.library.opcheck(ops.fused_lamb_moments_.default,
                          (params, grads[0], m, v, 0.9, 0.999, 1e-8, 0.01))  # fmt: skip
    steps = torch.full((len(params),), 1e-3)
    low = [torch.empty_like(p, dtype=torch.bfloat16) for p in params]
    torch.library.opcheck(ops.fused_lamb_apply_.default,
                          (params, m, v, low, steps, 0.9, 0.999, 1e-8, 0.01))  # fmt: skip
    ops.fused_lamb_apply_(params, m, v, low, steps, 0.9, 0.999, 1e-8, 0.01)
    assert all(torch.equal(lp, p.to(torch.bfloat16)) for lp, p in zip(low, params, strict=True))


LAMB_KEYS = {"lr": 1e-2, "weight_decay": 0.01, "betas": [0.8, 0.99], "eps": 1e-6,
             "bias_correction": False, "eps_inside_sqrt": True, "max_coeff": 0.6,
             "min_coeff": 0.3}  # fmt: skip


def _engine_and_fused(params: dict):
    import shardwise.zero

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    reference.load_state_dict(model.state_dict())
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Lamb", "params": params},
        "zero_optimization": {"stage": 1},
    }
    engine = shardwise.zero.initialize(model, config)
    given = {**params, "betas": tuple(params["betas"])}
    return engine, model, reference, shardwise.optim.FusedLamb(reference.parameters(), **given)


def test_deepspeeds_lamb_keys_reach_the_engine():
    """DeepSpeed's "type": "Lamb" with every FusedLamb key set away from its default
    (betas, eps, bias_correction, eps_inside_sqrt, max_coeff, min_coeff): the ZeRO engine steps
    as FusedLamb given the same arguments, with the same trust ratios, so each key reaches the
    C++ step (a key dropped leaves its default and changes the parameters or the ratios)."""
    engine, model, reference, opt = _engine_and_fused(LAMB_KEYS)
    for _ in range(8):
        x, y = torch.randn(4, 6), torch.randn(4, 3)
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        opt.step()
        opt.zero_grad()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-7), (ours - theirs).abs().max()
    ratios = engine.optimizer.lamb_coefficients().tolist()
    assert ratios == pytest.approx(opt.lamb_coeffs, rel=1e-6)
    assert {0.6, 0.3} & set(ratios), ratios  # both clamps are met on this model


def test_lamb_max_grad_norm_is_refused_and_lamb_keys_under_adamw_named():
    """FusedLamb's own clipping (max_grad_norm) is refused with the fix (gradient_clipping);
    Lamb's keys under AdamW are named as ignored instead of dropped unseen."""
    from shardwise.zero.config import ConfigError, load

    lamb = {"type": "Lamb", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}
    with pytest.raises(ConfigError, match="gradient_clipping"):
        load({"train_batch_size": 2, "optimizer": lamb}, 1)
    adamw = {"type": "AdamW", "params": {"lr": 1e-3, "max_coeff": 5.0, "eps_inside_sqrt": True}}
    ignored = load({"train_batch_size": 2, "optimizer": adamw}, 1)["ignored"]
    for key in ("max_coeff", "eps_inside_sqrt"):
        assert any(f"optimizer.params.{key} (" in entry for entry in ignored), (key, ignored)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_lamb_on_cuda_matches_the_cpu():
    """The CUDA kernels (the same per-element functions, block sums added up in a fixed order)
    against the CPU step: equal to rounding of the sums' order, and run twice, bit-identical."""
    params0, grads = problem()
    hp = {"lr": 1e-2, "weight_decay": 0.01}
    cpu, _ = run_fused(params0, grads, **hp)
    on_gpu = [[g.cuda() for g in step] for step in grads]
    cuda, _ = run_fused([p.cuda() for p in params0], on_gpu, **hp)
    again, _ = run_fused([p.cuda() for p in params0], on_gpu, **hp)
    for c, g, a in zip(cpu, cuda, again, strict=True):
        assert torch.allclose(g.cpu(), c, rtol=1e-5, atol=1e-7)
        assert torch.equal(g, a)
