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

    def wrapped(log, **keys):
        torch.manual_seed(0)
        body = nn.Sequential(*[_Block(str(i), log) for i in range(3)])
        cls = {"fsdp_transformer_layer_cls": ["_Block"]}
        return shardwise.wrap(body, {"use_fsdp": True, **cls, **keys})

    log: list = []
    plain = wrapped(log, fsdp_backward_prefetch="NO_PREFETCH")
    _step(plain, log)
    plain_seen = _step(plain, log)
    fetched = wrapped(log, fsdp_forward_prefetch=True, fsdp_backward_prefetch="backward_pre")
    _step(fetched, log)
    fetched_seen = _step(fetched, log)
    assert plain_seen[("0", "forward")] == 1, plain_seen
    assert fetched_seen[("0", "forward")] == 2, fetched_seen
    assert plain_seen[("2", "backward")] - plain_seen[("2", "forward")] == 1, plain_seen
    assert fetched_seen[("2", "backward")] - fetched_seen[("2", "forward")] == 2, fetched_seen
    whole = wrapped(log, fsdp_auto_wrap_policy="no_wrap")
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


def fsdp_activation_checkpointing_keeps_only_each_units_input(rank, world, gloo):
    """activation_checkpointing: each unit keeps only its input (DIM floats per row) where
    autograd saved its input, the hidden pre-activation and the GELU output (9 x DIM), to the
    byte, and the gradients are bitwise those without it. Catches the option accepted and the
    units not checkpointed."""
    log: list = []
    saved, grads = {}, {}
    for checkpointed in (False, True):
        model = _model(log, activation_checkpointing=checkpointed)
        storages: dict[int, int] = {}

        def pack(t, model=model, storages=storages):
            params = {p.untyped_storage().data_ptr() for p in model.parameters()}
            if t.untyped_storage().data_ptr() not in params:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        torch.manual_seed(1)
        x = torch.randn(BATCH, DIM)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(x).pow(2).sum()
        loss.backward()
        saved[checkpointed] = sum(storages.values())
        grads[checkpointed] = [p.grad.clone() for p in model.parameters()]
    outside = BATCH * DIM * 4  # what the loss saves: the model's output
    assert saved == {False: outside + 3 * BATCH * 9 * DIM * 4, True: outside + 3 * BATCH * DIM * 4}
    assert all(torch.equal(a, b) for a, b in zip(grads[False], grads[True], strict=True))


EFFECT_CHECKS = [f for n, f in sorted(globals().items()) if n.startswith("fsdp_")]
