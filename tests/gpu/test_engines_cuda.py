"""The engines on one GPU against the same training in plain torch on that GPU (fp32, so the
tolerances are those of tests/distributed): FSDP with prefetch on its all-gather and
reduce-scatter streams, ZeRO stages 1-3 with the fused AdamW, bf16 mixed precision, and the
backend's NCCL path. Catches streams that are not ordered (a copy-out before its all-gather, a
reduce-scatter before backward wrote the gradients: the results then differ), buffers reused
under a running kernel, and CUDA paths that never ran."""

import fsdp_checks
import pytest
import shardwise
import shardwise.zero
import torch
import torch.distributed as dist
import zero_checks
from fsdp_checks import assert_close_rel, global_batch, loss_of, make_model

CUDA = torch.device("cuda", 0)
STEPS = 8


def batches(steps=STEPS):
    return [tuple(t.to(CUDA) for t in global_batch(step, 1)) for step in range(steps)]


def reference(steps=STEPS, param_dtype=None):
    return fsdp_checks.train_reference(1, steps, param_dtype, device=CUDA)


def train(model, steps=STEPS):
    """AdamW as the reference's, on the same batches; the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for inputs, targets in batches(steps):
        loss = loss_of(model, inputs, targets)
        loss.backward()
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses


def train_engine(engine, steps=STEPS):
    """A ZeRO engine stepped on the reference's batches (its own optimizer); the losses."""
    losses = []
    for inputs, targets in batches(steps):
        loss = loss_of(engine, inputs, targets)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("prefetch", ["backward_pre", "backward_post"])
def test_fsdp_on_cuda_matches_plain_torch(group, prefetch):
    ref_losses, ref_model = reference()
    model = shardwise.FullyShardedDataParallel(
        make_model().to(CUDA),
        wrap=[f"layers.{i}" for i in range(3)],
        backward_prefetch=prefetch,
        forward_prefetch=True,
    )
    losses = train(model)
    torch.cuda.synchronize()
    assert_close_rel(losses, ref_losses, 1e-5, "losses")
    fsdp_checks.compare_params(model, ref_model, 1e-5, "parameters")


def test_fsdp_bf16_on_cuda_matches_the_bf16_reference(group):
    ref_losses, _ = reference(param_dtype=torch.bfloat16)
    model = shardwise.FullyShardedDataParallel(
        make_model().to(CUDA),
        wrap=[f"layers.{i}" for i in range(3)],
        param_dtype=torch.bfloat16,
        reduce_dtype=torch.float32,
    )
    losses = train(model)
    assert_close_rel(losses, ref_losses, 2e-2, "losses (bf16)")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_on_cuda_matches_plain_torch(group, stage):
    ref_losses, ref_model = reference()
    engine = shardwise.zero.initialize(make_model().to(CUDA), zero_checks.zero_config(stage, 1))
    losses = train_engine(engine)
    assert_close_rel(losses, ref_losses, 1e-5, f"stage {stage} losses")
    ours = engine.module.state_dict()
    for name, tensor in ref_model.state_dict().items():
        assert_close_rel(ours[name], tensor, 1e-5, f"stage {stage}: {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_collectives_on_cuda(group, dtype):
    x = torch.arange(1000, device=CUDA, dtype=dtype)
    dist.all_reduce(x)
    out = torch.empty(1000, device=CUDA, dtype=dtype)
    dist.all_gather_into_tensor(out, x)
    dist.reduce_scatter_tensor(x, out)
    dist.broadcast(x, 0)
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.arange(1000, dtype=dtype))
