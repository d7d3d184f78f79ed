"""Offload keys on a GPU, the only place they change where memory lives (on a CPU-only machine
every tensor is already in CPU memory): each key of the FSDP config, Accelerate's fsdp_config
and DeepSpeed's JSON that asks for offload, set as a user sets it, keeps the parameter shards or
the optimizer state in CPU memory (page-locked when pin_memory says so) while the model computes
on the GPU, and trains as the same run without offload. Catches an offload key parsed and the
state left on the GPU."""

import pytest
import shardwise
import shardwise.zero
import torch
import zero_checks
from fsdp_checks import assert_close_rel, make_model
from test_engines_cuda import CUDA, reference, train, train_engine


def _devices(tensors) -> set[str]:
    return {t.device.type for t in tensors}


@pytest.mark.parametrize(
    "keys, pinned",
    [
        ({"fsdp_cpu_offload": True}, False),
        ({"fsdp_offload_params": True}, False),  # Accelerate's spelling
    ],
)
def test_fsdp_offload_keys_keep_the_shards_in_cpu_memory(group, keys, pinned):
    ref_losses, _ = reference()
    plain = shardwise.wrap(make_model().to(CUDA), {"fsdp_auto_wrap_policy": "no_wrap"})
    assert _devices(plain.parameters()) == {"cuda"}
    model = shardwise.wrap(make_model().to(CUDA), {"fsdp_auto_wrap_policy": "no_wrap", **keys})
    assert _devices(model.parameters()) == {"cpu"}, keys
    assert all(p.is_pinned() == pinned for p in model.parameters())
    losses = train(model)
    torch.cuda.synchronize()
    assert _devices(model.parameters()) == {"cpu"}, keys
    assert_close_rel(losses, ref_losses, 1e-5, f"losses with {keys}")


ZERO_OFFLOADS = [
    ({"stage": 2}, "state", False),  # no offload: the state lives on the GPU
    ({"stage": 3}, "shards", False),
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "state", False),
    ({"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}, "state", True),
    ({"stage": 2, "cpu_offload": True}, "state", False),  # DeepSpeed's older spelling
    ({"stage": 3, "offload_param": {"device": "cpu"}}, "shards", False),
    ({"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True}}, "shards", True),
    ({"stage": 3, "cpu_offload_param": True}, "shards", False),
    ({"stage": 3, "cpu_offload_params": True}, "shards", False),
]


@pytest.mark.parametrize("zero, where, pinned", ZERO_OFFLOADS)
def test_zero_offload_keys_keep_the_state_in_cpu_memory(group, zero, where, pinned):
    ref_losses, _ = reference()
    config = zero_checks.zero_config(zero["stage"], 1)
    config["zero_optimization"].update(zero)
    engine = shardwise.zero.initialize(make_model().to(CUDA), config)
    losses = train_engine(engine)
    torch.cuda.synchronize()
    assert_close_rel(losses, ref_losses, 1e-5, f"losses with {zero}")
    memory = "cpu" if len(zero) > 1 else "cuda"
    if where == "state":
        state = [t for piece in engine.optimizer.state_pieces() for t in piece["tensors"].values()]
        assert state and _devices(state) == {memory}, zero
        assert engine.optimizer.pinned() == pinned, zero
    else:
        shards = list(engine.module.parameters())
        assert _devices(shards) == {memory}, zero
        assert all(p.is_pinned() == pinned for p in shards), zero
