"""Fidelity to torch's FSDP, run inside fsdp_checks' worlds. torch's MixedPrecision on torch's own
FSDP test model (common_fsdp's
TransformerWithSharedParams: a tied embedding and output projection, a BatchNorm, an fp32 and a
long buffer), run inside fsdp_checks' worlds. References: the model trained in fp32 in one process
(every rank feeds it the same batch, so that is what DDP computes), and torch's FSDP2 over gloo
with the policy torch's FSDP applies to it (the BatchNorm its own unit in fp32, its inputs cast
up and its output cast back to bf16). And the config's FSDP keys reaching what runs."""

import shardwise
import torch
import torch.distributed as dist
from torch import nn

STEPS = 4
LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def _model():
    """torch's test model, deterministic, dropout off (so every run is comparable) but in
    training mode (so the BatchNorm uses and updates its batch statistics)."""
    from torch.testing._internal.common_fsdp import (
        DEVICEInitMode,
        FSDPInitMode,
        TransformerWithSharedParams,
    )

    model = TransformerWithSharedParams.init(
        dist.group.WORLD, FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER, deterministic=True
    )
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0
    return model.train()


def _train(model, wrapped):
    """The losses of ``wrapped`` (``model`` inside it) over STEPS steps of SGD."""
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    losses = []
    for _ in range(STEPS):
        inputs = model.get_input("cpu")
        loss = model.get_loss(inputs, wrapped(*inputs))
        loss.backward()
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses


def _gradients(model, wrapped):
    """The gradients one more backward leaves on ``wrapped``'s parameters, by name."""
    inputs = model.get_input("cpu")
    model.get_loss(inputs, wrapped(*inputs)).backward()
    return {n: p.grad for n, p in wrapped.named_parameters() if p.grad is not None}


def _fsdp2(model, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world,))
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    fp32 = MixedPrecisionPolicy(
        param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=torch.bfloat16
    )
    for module in model.modules():
        if isinstance(module, LAYERS):
            fully_shard(module, mesh=mesh, mp_policy=bf16)
    fully_shard(model.bn, mesh=mesh, mp_policy=fp32)
    fully_shard(model, mesh=mesh, mp_policy=bf16)
    return model


def _full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def fsdp_batchnorm_runs_in_fp32_under_mixed_precision_as_torch_fsdp_runs_it(rank, world, gloo):
    """MixedPrecision(bf16, bf16, bf16) with an auto-wrap policy, on torch's own test model: the
    BatchNorm computes in fp32 on fp32 inputs, its weights and running statistics stay fp32, and
    the training error against fp32 is at most 2x FSDP2's with that policy. Catches a BatchNorm
    run in bf16 (its statistics rounded), its output left in fp32 for the bf16 layers after it,
    and the override dropped from the units."""
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    reference = _model()
    ref_losses = _train(reference, reference)
    torch_model = _fsdp2(_model(), world)
    torch_losses = _train(torch_model, torch_model)
    ours = _model()
    policy = MixedPrecision(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16
    )
    wrapped = shardwise.FullyShardedDataParallel(
        ours, auto_wrap_policy=ModuleWrapPolicy(set(LAYERS)), mixed_precision=policy
    )
    seen = []  # what the BatchNorm computes with: registered last, this hook runs last
    ours.bn.register_forward_pre_hook(
        lambda m, args: seen.append((args[0].dtype, m.weight.dtype, m.running_mean.dtype))
    )
    ours.bn.register_forward_hook(lambda _m, _args, out: seen.append(("out", out.dtype)))
    losses = _train(ours, wrapped)
    assert set(seen) == {(torch.float32,) * 3, ("out", torch.bfloat16)}, f"BatchNorm: {seen}"
    assert ours.vocab_bias.dtype == torch.bfloat16, "the other buffers follow buffer_dtype"
    torch_err = max(abs(a - b) / abs(b) for a, b in zip(torch_losses, ref_losses, strict=True))
    our_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    assert our_err <= 2 * torch_err + 1e-3, f"loss error {our_err:.3e} vs FSDP2 {torch_err:.3e}"
    state, ref_state = wrapped.state_dict(), reference.state_dict()
    torch_state = {k: _full(v) for k, v in torch_model.state_dict().items()}
    for name in ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"):
        assert state[name].dtype == torch.float32, f"{name}: {state[name].dtype}"
        torch_perr = (torch_state[name].float() - ref_state[name]).abs().max().item()
        our_perr = (state[name].float() - ref_state[name]).abs().max().item()
        assert our_perr <= 2 * torch_perr + 1e-4, f"{name}: {our_perr:.3e} vs {torch_perr:.3e}"


def fsdp_keep_low_precision_grads_hands_the_optimizer_param_dtype_gradients(rank, world, gloo):
    """MixedPrecision(bf16, bf16, bf16, keep_low_precision_grads=True) on torch's test model,
    wrapped as torch's FSDP wraps it: the gradients SGD steps are bf16 (the BatchNorm's, a
    full-precision unit, fp32) as under torch's FSDP, their shards take half the bytes, and
    training is bit for bit the run that kept fp32 gradient shards (the values are bf16 either
    way); its error against fp32 is at most 2x torch FSDP's with the same policy. Catches the
    option refused, ignored (fp32 gradients), or its gradients rounded differently."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    def policy(keep):
        bf16 = torch.bfloat16
        return MixedPrecision(bf16, bf16, bf16, keep_low_precision_grads=keep)

    wrap_policy = ModuleWrapPolicy(set(LAYERS))
    reference = _model()
    ref_losses = _train(reference, reference)
    torch_model = _model()
    torch_fsdp = FullyShardedDataParallel(
        torch_model, auto_wrap_policy=wrap_policy, mixed_precision=policy(True),
        device_id=torch.device("cpu"),
    )  # fmt: skip
    torch_losses = _train(torch_model, torch_fsdp)
    runs = {}
    for keep in (False, True):
        model = _model()
        wrapped = shardwise.FullyShardedDataParallel(
            model, auto_wrap_policy=wrap_policy, mixed_precision=policy(keep)
        )
        losses = _train(model, wrapped)
        grads = _gradients(model, wrapped)
        runs[keep] = (losses, grads, wrapped.memory_bytes()["gradients"])
    (full_losses, full_grads, full_bytes), (losses, grads, low_bytes) = runs[False], runs[True]
    full_grads = {n: g.dtype for n, g in full_grads.items()}
    low_elements = sum(g.numel() for g in grads.values() if g.dtype == torch.bfloat16)
    grads = {n: g.dtype for n, g in grads.items()}
    assert losses == full_losses, f"{losses} vs {full_losses}"
    assert set(full_grads.values()) == {torch.float32}, full_grads
    low = {n for n, d in grads.items() if d == torch.bfloat16}
    assert set(grads.values()) == {torch.bfloat16, torch.float32}, grads
    full_precision = sorted(n.rpartition("bn.")[1:] for n in grads if n not in low)
    assert full_precision == [("bn.", "bias"), ("bn.", "weight")], grads
    assert full_bytes - low_bytes == 2 * low_elements > 0, (full_bytes, low_bytes, low_elements)
    torch_grads = {g.dtype for g in _gradients(torch_model, torch_fsdp).values()}
    assert torch.bfloat16 in torch_grads, f"torch's FSDP: {torch_grads}"
    torch_err = max(abs(a - b) / abs(b) for a, b in zip(torch_losses, ref_losses, strict=True))
    our_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    assert our_err <= 2 * torch_err + 1e-3, f"loss error {our_err:.3e} vs FSDP {torch_err:.3e}"


class BufferAdd(nn.Module):
    """Two units with an fp32 buffer added to the activations between them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.register_buffer("shift", torch.full((8,), 0.5))

    def forward(self, x):
        return self.b(self.a(x) + self.shift)


def fsdp_forward_inputs_are_cast_by_torchs_rules(rank, world, gloo):
    """cast_forward_inputs, cast_root_forward_inputs and buffer_dtype as torch's FSDP reads
    them: by default a unit fed fp32 (an fp32 buffer added to its bf16 input) fails, and the
    error names the unit, the dtypes and the fix; cast_forward_inputs=True or buffer_dtype=bf16
    make it run, bit for bit as the bf16 computation by hand; cast_root_forward_inputs=False
    leaves the root's fp32 input as it is. Catches an option read and ignored."""
    import pytest
    from torch.distributed.fsdp import MixedPrecision

    def wrapped(**policy):
        mixed = MixedPrecision(param_dtype=torch.bfloat16, **policy)
        return shardwise.FullyShardedDataParallel(
            BufferAdd(), wrap=["a", "b"], mixed_precision=mixed
        )

    x = torch.randn(4, 8)
    with pytest.raises(
        shardwise.fsdp.precision.MixedPrecisionError, match="'b'.*float32.*cast_forward_inputs"
    ):
        wrapped()(x)
    by_hand = BufferAdd().to(torch.bfloat16)
    with torch.no_grad():
        expected = by_hand.b(by_hand.a(x.bfloat16()) + by_hand.shift)
        for policy in ({"cast_forward_inputs": True}, {"buffer_dtype": torch.bfloat16}):
            out = wrapped(**policy)(x)
            assert out.dtype == torch.bfloat16 and torch.equal(out, expected), policy
    with pytest.raises(shardwise.fsdp.precision.MixedPrecisionError, match="'a'"):
        wrapped(cast_root_forward_inputs=False, buffer_dtype=torch.bfloat16)(x)


def fsdp_a_pipeline_stage_takes_the_configs_fsdp_keys(rank, world, gloo):
    """Under strategy pipeline each stage was FullyShardedDataParallel(stage, process_group=...)
    and every FSDP key was dropped. A stage wrapped as one unit now runs the config's mixed
    precision and sharding strategy, names the wrapping keys it has no use for, and refuses
    hybrid sharding naming the fix; fsdp_min_num_params beside transformer_auto_wrap is named
    too. Catches the keys dropped again without a word."""
    import pytest
    from shardwise.fsdp import ConfigError, wrap

    def two_linears():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))

    keys = {
        "use_fsdp": True,
        "fsdp_mixed_precision": True,
        "fsdp_param_dtype": "bfloat16",
        "fsdp_sharding_strategy": "no_shard",
        "fsdp_auto_wrap_policy": "transformer_auto_wrap",
    }
    with pytest.warns(UserWarning, match="fsdp_auto_wrap_policy ignored"):
        stage = wrap(two_linears(), keys, one_unit=True)
    assert stage.units() == ["<root>"], stage.units()
    assert stage(torch.randn(2, 8)).dtype == torch.bfloat16
    assert all(s.valid == s.numel for s in stage.owned_slices()), "no_shard: whole everywhere"
    sharded = wrap(two_linears(), {"use_fsdp": True}, one_unit=True)
    assert world == 1 or any(s.valid < s.numel for s in sharded.owned_slices())
    with pytest.raises(ConfigError, match="model.mesh_shape"):
        wrap(two_linears(), {**keys, "fsdp_sharding_strategy": "hybrid_shard"}, one_unit=True)
    whole = {"use_fsdp": True, "fsdp_auto_wrap_policy": "transformer_auto_wrap"}
    with pytest.warns(UserWarning, match="fsdp_min_num_params ignored"):
        wrap(two_linears(), {**whole, "fsdp_min_num_params": 10})


def fsdp_no_sync_reduces_nothing_and_bf16_gathers_move_half_the_bytes(rank, world, gloo):
    """Effects counted by the backend (communication_stats): inside no_sync a backward issues no
    reduce-scatter or all-reduce, and the first backward after it reduces each unit once; the
    all-gathers of bf16 parameters move exactly half the bytes of the same all-gathers in fp32.
    Catches no_sync or param_dtype accepted without changing the traffic."""
    from shardwise import _C

    def model(**kwargs):
        torch.manual_seed(0)
        body = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
        return shardwise.FullyShardedDataParallel(body, wrap=["0", "1"], **kwargs)

    def delta(before, after, kind, key="calls"):
        return after.get(kind, {}).get(key, 0) - before.get(kind, {}).get(key, 0)

    x = torch.randn(4, 64)
    m = model()
    start = _C.communication_stats()
    with m.no_sync():
        m(x).sum().backward()
    synced = _C.communication_stats()
    m(x).sum().backward()
    end = _C.communication_stats()
    assert delta(start, synced, "reduce_scatter") == 0, synced
    assert delta(start, synced, "all_reduce") == 0, synced
    assert delta(synced, end, "reduce_scatter") == 2, end  # the two units (the root holds none)
    full, half = model(), model(param_dtype=torch.bfloat16)
    before = _C.communication_stats()
    full(x)
    middle = _C.communication_stats()
    half(x)
    after = _C.communication_stats()
    fp32_bytes = delta(before, middle, "all_gather", "bytes")
    assert fp32_bytes > 0 and delta(middle, after, "all_gather", "bytes") * 2 == fp32_bytes


CHECKS = [f for n, f in sorted(globals().items()) if n.startswith("fsdp_")]
