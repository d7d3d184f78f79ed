"""FSDP options seen in what runs, run inside fsdp_checks' worlds: communication counted by the
backend (``_C.communication_stats``) at the moment a unit computes, and the bytes autograd saves
counted by a saved-tensors hook. Each check fails when its option is accepted and ignored."""

import shardwise
import torch
from torch import nn

DIM, BATCH = 32, 4


class _Probe(torch.autograd.Function):
    """Identity that records the backend's all-gather count when forward and backward pass it."""

    @staticmethod
    def forward(ctx, x, log, name):
        ctx.log, ctx.name = log, name
        log.append((name, "forward", _gathers()))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append((ctx.name, "backward", _gathers()))
        return grad, None, None


class _Block(nn.Module):
    def __init__(self, name: str, log: list):
        super().__init__()
        self.name, self.log = name, log
        self.inner = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        return self.inner(_Probe.apply(x, self.log, self.name))


def _gathers() -> int:
    from shardwise import _C

    return _C.communication_stats().get("all_gather", {}).get("calls", 0)


def _model(log: list, **kwargs):
    torch.manual_seed(0)
    body = nn.Sequential(*[_Block(str(i), log) for i in range(3)])
    return shardwise.FullyShardedDataParallel(body, wrap=["0", "1", "2"], **kwargs)


def _seen(log: list, start: int) -> dict:
    """The all-gathers issued since ``start`` when each block's probe ran, by (block, pass)."""
    return {(name, where): count - start for name, where, count in log}


def _step(model, log: list) -> dict:
    log.clear()
    start = _gathers()
    model(torch.randn(BATCH, DIM)).pow(2).sum().backward()
    return _seen(log, start)


def _wrapped(log: list, seed: int = 0, **keys):
    """Three probed blocks through shardwise.wrap with these FSDP (or Accelerate) config keys,
    each block a unit unless the keys say otherwise."""
    torch.manual_seed(seed)
    body = nn.Sequential(*[_Block(str(i), log) for i in range(3)])
    return shardwise.wrap(body, {"fsdp_transformer_layer_cls": ["_Block"], **keys})


def fsdp_prefetch_gathers_the_next_unit_before_the_current_one_computes(rank, world, gloo):
    """forward_prefetch: once the order is recorded, unit 1's all-gather is issued by the time
    unit 0 computes (2 gathers, not 1); backward_pre: unit 1's backward all-gather is issued by
    the time unit 2 computes its backward (unit 2's own and unit 1's), backward_prefetch none
    waits for unit 1's backward. Catches either prefetch option accepted and not run."""
    log: list = []
    plain = _model(log, backward_prefetch="none")
    _step(plain, log)
    plain_seen = _step(plain, log)
    fetched = _model(log, forward_prefetch=True, backward_prefetch="backward_pre")
    _step(fetched, log)  # records the forward order
    fetched_seen = _step(fetched, log)
    assert plain_seen[("0", "forward")] == 1, plain_seen
    assert fetched_seen[("0", "forward")] == 2, fetched_seen
    assert plain_seen[("2", "backward")] - plain_seen[("2", "forward")] == 1, plain_seen
    assert fetched_seen[("2", "backward")] - fetched_seen[("2", "forward")] == 2, fetched_seen


def fsdp_the_configs_prefetch_and_wrap_keys_run_as_the_arguments(rank, world, gloo):
    """The same counts through shardwise.wrap and the FSDP config keys: fsdp_forward_prefetch
    and fsdp_backward_prefetch (Accelerate's NO_PREFETCH spelling for none) change when the
    next unit's all-gather is issued, and transformer_auto_wrap with
    fsdp_transformer_layer_cls makes each block a unit (one all-gather per block; with no_wrap
    the whole model is one unit, gathered once before block 0). Catches the keys parsed and
    the wrapping or prefetch left at their defaults."""

    log: list = []
    plain = _wrapped(log, fsdp_backward_prefetch="NO_PREFETCH")
    _step(plain, log)
    plain_seen = _step(plain, log)
    fetched = _wrapped(log, fsdp_forward_prefetch=True, fsdp_backward_prefetch="backward_pre")
    _step(fetched, log)
    fetched_seen = _step(fetched, log)
    assert plain_seen[("0", "forward")] == 1, plain_seen
    assert fetched_seen[("0", "forward")] == 2, fetched_seen
    assert plain_seen[("2", "backward")] - plain_seen[("2", "forward")] == 1, plain_seen
    assert fetched_seen[("2", "backward")] - fetched_seen[("2", "forward")] == 2, fetched_seen
    whole = _wrapped(log, fsdp_auto_wrap_policy="no_wrap")
    _step(whole, log)
    whole_seen = _step(whole, log)
    assert whole_seen[("0", "forward")] == whole_seen[("2", "forward")] == 1, whole_seen


def fsdp_shard_grad_op_keeps_parameters_gathered_until_backward(rank, world, gloo):
    """shard_grad_op: after forward every unit's parameters are still full (their own shapes)
    and backward gathers nothing; full_shard: they are shards after forward and backward
    gathers each unit again. Catches the strategy mapped to full_shard."""
    log: list = []
    for strategy, gathered, backward_gathers in (
        ("shard_grad_op", True, 0),
        ("full_shard", False, 3),
    ):
        model = _model(log, sharding_strategy=strategy)
        _step(model, log)  # the first backward also all-gathers the forward order to check it
        start = _gathers()
        loss = model(torch.randn(BATCH, DIM)).pow(2).sum()
        shapes = [tuple(p.shape) for p in model.module[1].inner[0].parameters()]
        assert (shapes == [(4 * DIM, DIM), (4 * DIM,)]) == gathered, (strategy, shapes)
        after_forward = _gathers() - start
        loss.backward()
        assert _gathers() - start - after_forward == backward_gathers, strategy


def _saved_bytes(model, x) -> int:
    """The bytes autograd saves for backward in one forward of ``model`` (parameters aside)."""
    storages: dict[int, int] = {}

    def pack(t):
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        if t.untyped_storage().data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).pow(2).sum()
    loss.backward()
    return sum(storages.values())


# what the loss saves (the model's output), and what each unit saves without checkpointing (its
# input, the hidden pre-activation and the GELU output) and with it (its input only)
_OUTSIDE, _PLAIN, _CHECKPOINTED = BATCH * DIM * 4, BATCH * 9 * DIM * 4, BATCH * DIM * 4


def fsdp_activation_checkpointing_keeps_only_each_units_input(rank, world, gloo):
    """activation_checkpointing: each unit keeps only its input (DIM floats per row) where
    autograd saved its input, the hidden pre-activation and the GELU output (9 x DIM), to the
    byte, and the gradients are bitwise those without it. Catches the option accepted and the
    units not checkpointed."""
    log: list = []
    saved, grads = {}, {}
    for checkpointed in (False, True):
        model = _model(log, activation_checkpointing=checkpointed)
        torch.manual_seed(1)
        saved[checkpointed] = _saved_bytes(model, torch.randn(BATCH, DIM))
        grads[checkpointed] = [p.grad.clone() for p in model.parameters()]
    assert saved == {False: _OUTSIDE + 3 * _PLAIN, True: _OUTSIDE + 3 * _CHECKPOINTED}
    assert all(torch.equal(a, b) for a, b in zip(grads[False], grads[True], strict=True))


def fsdp_the_configs_checkpointing_and_strategy_keys_run(rank, world, gloo):
    """Through shardwise.wrap: gradient_checkpointing (and Accelerate's
    fsdp_activation_checkpointing) make each unit keep only its input, to the byte;
    Accelerate's fsdp_reshard_after_forward=false keeps the gathered parameters for backward
    (backward gathers nothing) where true gathers each unit again. Catches a key parsed and its
    engine argument left at the default."""
    log: list = []
    x = torch.randn(BATCH, DIM)
    for keys in ({}, {"gradient_checkpointing": True}, {"fsdp_activation_checkpointing": True}):
        per_unit = _CHECKPOINTED if keys else _PLAIN
        assert _saved_bytes(_wrapped(log, **keys), x) == _OUTSIDE + 3 * per_unit, keys
    for reshard, backward_gathers in ((False, 0), (True, 3)):
        model = _wrapped(log, fsdp_reshard_after_forward=reshard)
        _step(model, log)  # the first backward also all-gathers the forward order to check it
        start = _gathers()
        loss = model(x).pow(2).sum()
        after_forward = _gathers() - start
        loss.backward()
        assert _gathers() - start - after_forward == backward_gathers, reshard


def fsdp_the_configs_unit_and_sync_keys_run(rank, world, gloo):
    """Through shardwise.wrap: use_fsdp=false returns the module itself; size_based_auto_wrap
    makes each block a unit when fsdp_min_num_params is below a block's parameters (block 2's
    forward sees gathers after block 0's) and none when above (one gather before block 0);
    Accelerate's fsdp_transformer_layer_cls_to_wrap and fsdp_backward_prefetch_policy give the
    FSDP keys' units and prefetch; sync_module_states (and fsdp_sync_module_states) make ranks
    that built different models all start from the model rank 0 built (its output), which
    without it they do not (each keeps the shard of its own). Catches each key ignored."""
    log: list = []
    body = nn.Linear(DIM, DIM)
    assert shardwise.wrap(body, {"use_fsdp": False}) is body
    block = sum(p.numel() for p in _Block("x", log).parameters())
    size = {"fsdp_auto_wrap_policy": "size_based_auto_wrap"}
    for bound, per_block in ((block - 1, True), (block + 1, False)):
        model = _wrapped(log, **size, fsdp_min_num_params=bound)
        _step(model, log)
        seen = _step(model, log)
        assert (seen[("2", "forward")] > seen[("0", "forward")]) == per_block, (bound, seen)
    # Accelerate's spellings: the blocks named as the units and no backward prefetch give the
    # FSDP keys' gathers; without the class named, the Sequential's blocks are no units
    ours = _wrapped(log, fsdp_backward_prefetch="NO_PREFETCH")
    _step(ours, log)
    expected = _step(ours, log)
    for spelled, same in (({}, False), ({"fsdp_transformer_layer_cls_to_wrap": "_Block"}, True)):
        body = nn.Sequential(*[_Block(str(i), log) for i in range(3)])
        theirs = shardwise.wrap(body, {**spelled, "fsdp_backward_prefetch_policy": "NO_PREFETCH"})
        _step(theirs, log)
        assert (_step(theirs, log) == expected) == same, (spelled, expected)
    # without sync, every rank keeps its shard of the model it built: the gathered parameters mix
    # rank 0's and rank 1's, so they are not rank 0's model
    x = torch.ones(BATCH, DIM)
    rank0 = _wrapped(log, seed=0, use_fsdp=False)(x)
    for keys in ({}, {"sync_module_states": True}, {"fsdp_sync_module_states": True}):
        out = _wrapped(log, seed=rank, **keys)(x)
        assert torch.equal(out, rank0) == bool(keys), keys


def fsdp_the_configs_precision_keys_cast_buffers_and_reductions(rank, world, gloo):
    """Through shardwise.wrap under fsdp_mixed_precision: fsdp_buffer_dtype=bfloat16 casts the
    buffers (float32 keeps them), and fsdp_reduce_dtype=bfloat16 reduce-scatters the gradients
    in half the bytes of float32. Catches the dtype keys parsed and the policy built without
    them."""
    from shardwise import _C

    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(DIM, DIM)
            self.register_buffer("shift", torch.ones(DIM))

        def forward(self, x):
            return self.layer(x) + self.shift.to(x.dtype)

    scattered = {}
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        keys = {"fsdp_mixed_precision": True, "fsdp_param_dtype": "bfloat16"}
        model = shardwise.wrap(
            WithBuffer(), {**keys, "fsdp_buffer_dtype": dtype, "fsdp_reduce_dtype": dtype}
        )
        assert model.module.shift.dtype == getattr(torch, dtype), (dtype, model.module.shift)
        before = _C.communication_stats().get("reduce_scatter", {}).get("bytes", 0)
        model(torch.randn(BATCH, DIM)).float().pow(2).sum().backward()
        scattered[dtype] = _C.communication_stats()["reduce_scatter"]["bytes"] - before
    assert 2 * scattered["bfloat16"] == scattered["float32"], scattered


EFFECT_CHECKS = [f for n, f in sorted(globals().items()) if n.startswith("fsdp_")]
