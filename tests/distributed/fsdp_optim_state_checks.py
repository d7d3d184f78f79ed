"""shardwise.fsdp.optim_state: the optimizer state of a FullyShardedDataParallel model, or of a
model fully_shard sharded, whole (what Accelerate's save_state writes from rank 0), and loaded
back as slices."""

from __future__ import annotations

import shardwise
import torch
import torch.distributed as dist
from shardwise.fsdp import optim_state

STEPS = 3


def _trained(model, rank, world):
    """``model`` (sharded) and one process's copy trained STEPS steps on the same global batches:
    (model's optimizer, the copy's optimizer)."""
    from fsdp_checks import global_batch, local, loss_of, make_model, optimizer_for

    opt = optimizer_for(model)
    reference = make_model()
    ref_opt = optimizer_for(reference)
    for step in range(STEPS):
        loss_of(model, *local(global_batch(step, world), rank)).backward()
        opt.step()
        opt.zero_grad()
        loss_of(reference, *global_batch(step, world)).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return opt, ref_opt


def _assert_state_close(full: dict, expected: dict) -> None:
    """Every AdamW moment of ``full`` has the reference's shape and values (within 1e-5 of the
    largest)."""
    for index, state in expected.items():
        for key in ("exp_avg", "exp_avg_sq"):
            ours = full["state"][index][key]
            assert ours.shape == state[key].shape, (index, key, ours.shape, state[key].shape)
            scale = state[key].abs().max().item() or 1.0
            assert (ours - state[key]).abs().max().item() <= 1e-5 * scale, (index, key)


def fsdp_full_optimizer_state_is_the_single_process_state(rank, world, gloo):
    """Catches a slice gathered from the wrong rank or offset, a state left in the shard's
    shape, the optimizer's live state overwritten by the gathered copy (torch's state_dict
    shares it), and a load that hands a rank another rank's slice: the whole state equals one
    process's AdamW state after the same steps, and loads into a model over another world size
    (one rank) and back into one over this world exactly."""
    from fsdp_checks import make_model, optimizer_for

    wrap = [f"layers.{i}" for i in range(3)]
    model = shardwise.FullyShardedDataParallel(make_model(), wrap=wrap)
    opt, ref_opt = _trained(model, rank, world)
    live = {i: s["exp_avg"].clone() for i, s in opt.state_dict()["state"].items()}
    full = optim_state.full_optim_state_dict(model, opt)
    expected = ref_opt.state_dict()["state"]
    assert sorted(full["state"]) == sorted(expected)
    _assert_state_close(full, expected)
    assert all(float(full["state"][index]["step"]) == STEPS for index in expected)
    for index, before in live.items():  # the optimizer's own state is still this rank's slices
        assert torch.equal(opt.state_dict()["state"][index]["exp_avg"], before), index
    alone = [dist.new_group([r]) for r in range(world)][rank]  # every rank creates every group
    solo = shardwise.FullyShardedDataParallel(make_model(seed=7), process_group=alone)
    solo_opt = optimizer_for(solo)
    optim_state.load_full_optim_state_dict(solo, solo_opt, full)
    again = shardwise.FullyShardedDataParallel(make_model(seed=9), wrap=wrap)
    again_opt = optimizer_for(again)
    optim_state.load_full_optim_state_dict(again, again_opt, full)
    for other in ((solo, solo_opt), (again, again_opt)):
        whole = optim_state.full_optim_state_dict(*other)
        for index, state in full["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(whole["state"][index][key], state[key]), (index, key)


def _fully_sharded(seed: int = 0):
    from fsdp_checks import make_model

    model = make_model(seed=seed)
    for layer in model.layers:
        shardwise.fully_shard(layer)
    return shardwise.fully_shard(model)


def fully_shard_full_optimizer_state_is_the_single_process_state(rank, world, gloo):
    """Catches fully_shard's units named to optim_state in another order than the optimizer's
    (a state gathered into the wrong parameter), or gathered over the wrong group: after the
    same steps the whole AdamW state equals one process's, and it loads into a fresh
    fully_shard model that gathers it back exactly."""
    from fsdp_checks import global_batch, local, loss_of, optimizer_for

    model = _fully_sharded()
    opt, ref_opt = _trained(model, rank, world)
    full = optim_state.full_optim_state_dict(model, opt)
    _assert_state_close(full, ref_opt.state_dict()["state"])
    again = _fully_sharded(seed=9)
    again_opt = optimizer_for(again)
    loss_of(again, *local(global_batch(0, world), rank)).backward()  # the root's engine starts
    again_opt.zero_grad()
    optim_state.load_full_optim_state_dict(again, again_opt, full)
    whole = optim_state.full_optim_state_dict(again, again_opt)
    for index, state in full["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(whole["state"][index][key], state[key]), (index, key)


CHECKS = [
    fsdp_full_optimizer_state_is_the_single_process_state,
    fully_shard_full_optimizer_state_is_the_single_process_state,
]
