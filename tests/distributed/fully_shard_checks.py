"""shardwise.fully_shard against torch's fully_shard (FSDP2), run inside fsdp_checks' worlds.

The models are torch's own test models (common_fsdp's MLPStack with its uneven widths and
TransformerWithSharedParams with its BatchNorm and tied embedding; common_dtensor's Transformer,
the one FSDP2's tests train), sharded as FSDP2's tests shard them: each block, then the root.
torch's runs over gloo (the reference); ours over the shardwise backend."""

import os

import pytest
import shardwise
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

STEPS = 3
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)


def _no_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0
    return model


def _mlp_stack():
    from torch.testing._internal.common_fsdp import MLPStack

    torch.manual_seed(0)
    model = MLPStack(16)
    return model, list(model), lambda step: torch.randn(4, 16, generator=_gen(step))


def _transformer():
    from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

    torch.manual_seed(0)
    model = _no_dropout(Transformer(ModelArgs(n_layers=3, dropout_p=0.0)))
    return (
        model,
        list(model.layers),
        lambda step: torch.randint(0, 8, (4, 16), generator=_gen(step)),
    )


def _shared_params():
    from torch.testing._internal.common_fsdp import (
        DEVICEInitMode,
        FSDPInitMode,
        TransformerWithSharedParams,
    )

    model = TransformerWithSharedParams.init(
        dist.group.WORLD, FSDPInitMode.NO_FSDP, DEVICEInitMode.DEVICE_NEVER, deterministic=True
    )
    model = _no_dropout(model).train()
    blocks = [m for m in model.modules() if isinstance(m, nn.TransformerEncoderLayer)]
    blocks += [m for m in model.modules() if isinstance(m, nn.TransformerDecoderLayer)]
    return model, blocks + [model.bn], None


MODELS = {"MLPStack": _mlp_stack, "Transformer": _transformer, "SharedParams": _shared_params}


def _seed(step: int) -> int:
    return 100 + step + 1000 * dist.get_rank()  # each rank its own batch, as in training


def _gen(step: int) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(step))


def _loss(model, inputs, name):
    if name == "SharedParams":
        return model.get_loss(inputs, model(*inputs))
    out = model(inputs)
    return out.float().pow(2).mean() if name == "MLPStack" else out.float().logsumexp(-1).mean()


def _inputs(model, make, name, step):
    if name == "SharedParams":
        torch.manual_seed(_seed(step))
        return model.get_input("cpu")
    return make(step)


def _shard(api, model, blocks, mesh, policy, name, reshard=None):
    """FSDP2's recipe: each block (reshard_after_forward=`reshard`), then the root; torch's
    BatchNorm rule by hand (an fp32 unit whose output goes back to bf16) where the model has one."""
    for block in blocks:
        if isinstance(block, nn.BatchNorm1d):
            fp32 = (
                MixedPrecisionPolicy(output_dtype=torch.bfloat16) if policy.param_dtype else policy
            )
            api(block, mesh=mesh, mp_policy=fp32, reshard_after_forward=reshard)
        else:
            api(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    return api(model, mesh=mesh, mp_policy=policy)


def _full_grads(model) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient: FSDP2's DTensors gathered; ours from each rank's piece
    (its owned slice) summed over the ranks."""
    out = {}
    slices = model.owned_slices() if isinstance(model, shardwise.FSDPModule) else {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if name not in slices:
            out[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            continue
        start, valid, numel = slices[name]
        flat = torch.zeros(numel, dtype=p.grad.dtype)
        flat[start : start + valid] = p.grad.reshape(-1)
        dist.all_reduce(flat)
        out[name] = flat
    return out


def _run(name, api, mesh, policy, reshard=None):
    """Losses, the full gradients of step 1 and the final full state under SGD."""
    model, blocks, make = MODELS[name]()
    if api is not None:
        model = _shard(api, model, blocks, mesh, policy, name, reshard)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, grads = [], None
    for step in range(STEPS):
        loss = _loss(model, _inputs(model, make, name, step), name)
        loss.backward()
        losses.append(loss.item())
        if grads is None:
            grads = _full_grads(model)
        opt.step()
        opt.zero_grad()
    state = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v)
        for k, v in model.state_dict().items()
    }
    return losses, grads, state


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[k].float().reshape(-1) - b[k].float().reshape(-1)).abs().max().item() for k in a)


def fully_shard_matches_torchs_fully_shard_on_its_test_models(rank, world, gloo):
    """Three of torch's test models sharded block by block and at the root, fp32: losses, the
    full gradients of the first step and the final state dict equal torch's fully_shard over
    gloo within 1e-6 (the loss relative to its size). Catches a parameter missed by
    the bottom-up rule (a tied weight, a block's), a wrong gradient scale, a root resharded too
    early, and a state dict that is not the plain model's."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch_mesh = DeviceMesh.from_group(gloo, "cpu")
    policy = MixedPrecisionPolicy()
    for name in MODELS:
        ref = _run(name, fully_shard, torch_mesh, policy)
        ours = _run(name, shardwise.fully_shard, None, policy)
        _assert_matches(ours, ref, name)


def _assert_matches(ours, ref, name):
    """Losses within 1e-6 of their size, the first step's gradients and the final state within
    1e-6."""
    for a, b in zip(ours[0], ref[0], strict=True):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), f"{name} losses {ours[0]} vs {ref[0]}"
    assert _max_diff(ours[1], ref[1]) <= 1e-6, f"{name} gradients {_max_diff(ours[1], ref[1])}"
    assert _max_diff(ours[2], ref[2]) <= 1e-6, f"{name} state {_max_diff(ours[2], ref[2])}"


def _errors(run, exact) -> tuple[float, float, float]:
    loss = max(abs(a - b) for a, b in zip(run[0], exact[0], strict=True))
    return loss, _max_diff(run[1], exact[1]), _max_diff(run[2], exact[2])


def fully_shard_bf16_policy_errs_no_more_than_torchs(rank, world, gloo):
    """MixedPrecisionPolicy(bf16, bf16) on the same models: the loss and final-state error
    against torch's fully_shard in fp32 (which matches DDP) is at most 2x torch's fully_shard's
    with the same policy; the parameters stay fp32 between steps. Catches param_dtype or
    reduce_dtype accepted and not applied, or applied to the shards."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch_mesh = DeviceMesh.from_group(gloo, "cpu")
    for name in MODELS:
        exact = _run(name, fully_shard, torch_mesh, MixedPrecisionPolicy())
        ref = _run(name, fully_shard, torch_mesh, BF16)
        ours = _run(name, shardwise.fully_shard, None, BF16)
        assert all(v.dtype == exact[2][k].dtype for k, v in ours[2].items()), name

        mine, torchs = _errors(ours, exact), _errors(ref, exact)
        assert mine[0] > 0, f"{name}: bf16 changed nothing: the policy was not applied"
        for what, a, b in zip(("loss", "gradient", "state"), mine, torchs, strict=True):
            assert a <= 2 * b, f"{name} {what} error {a:.3e} vs torch's {b:.3e}"


def fully_shard_hsdp_over_a_2d_mesh_matches_torchs(rank, world, gloo):
    """A 2-D (2, world / 2) (replicate, shard) mesh, for the even worlds test_fsdp runs: HSDP, as
    FSDP2 reads it. On MLPStack, losses and the final
    state equal torch's fully_shard on the same mesh within 1e-6, and a rank holds the same pieces
    as its replicas (dim 0) and other pieces than its shard group (dim 1). Catches the mesh's
    dims read the wrong way round (the replicas sharding) or the all-reduce over replicas
    dropped."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    ref = _run("MLPStack", fully_shard, mesh, MixedPrecisionPolicy())
    ours = _run("MLPStack", shardwise.fully_shard, mesh, MixedPrecisionPolicy())
    assert max(abs(a - b) for a, b in zip(ours[0], ref[0], strict=True)) <= 1e-6
    assert _max_diff(ours[2], ref[2]) <= 1e-6
    model, _, _ = _mlp_stack()  # who holds what: a rank shares its pieces with its replicas only
    slices = [None] * world
    dist.all_gather_object(slices, shardwise.fully_shard(model, mesh=mesh).owned_slices())
    coordinate = [r % (world // 2) for r in range(world)]  # the shard dim is the fast one
    for r in range(world):
        same = [q for q in range(world) if slices[q] == slices[r]]
        assert same == [q for q in range(world) if coordinate[q] == coordinate[r]], slices


def fully_shard_state_dict_loads_into_the_plain_model_and_back(rank, world, gloo):
    """state_dict() of a sharded model is the plain model's (it loads into an unwrapped copy with
    strict=True, equal to torch's full state); the plain model's state dict loads into a freshly
    sharded model, which then computes the same loss as the plain one. Catches names of the
    wrapped classes leaking into keys, and a load that sets only rank 0's pieces."""
    model, blocks, make = _mlp_stack()
    plain, _, _ = _mlp_stack()
    _shard(shardwise.fully_shard, model, blocks, None, MixedPrecisionPolicy(), "MLPStack")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # each rank scales its pieces
    plain.load_state_dict(model.state_dict(), strict=True)
    fresh, fresh_blocks, _ = _mlp_stack()
    _shard(shardwise.fully_shard, fresh, fresh_blocks, None, MixedPrecisionPolicy(), "MLPStack")
    fresh.load_state_dict(plain.state_dict(), strict=True)
    x = make(0)
    assert torch.equal(fresh(x), plain(x))
    with pytest.raises(RuntimeError, match="missing keys"):
        fresh.load_state_dict({k: v for k, v in plain.state_dict().items() if "0.in_proj" not in k})
    _through_a_checkpoint(model, rank, world)


def _through_a_checkpoint(model, rank, world):
    """Saved with shardwise's checkpoint writer from this world's pieces; loaded into the plain
    model (one rank's view of every rank's pieces) and into a fresh model sharded here."""
    import shutil
    from pathlib import Path

    from shardwise import pieces
    from shardwise.train import checkpoint

    directory = Path(f"/tmp/shardwise-fully-shard-{os.environ['MASTER_PORT']}")
    step_dir = checkpoint.save(
        directory, 1, {"model": pieces.to_pieces(model.checkpoint_slots())}, rank, world, ""
    )
    saved = [p for r in range(world) for p in checkpoint.load(step_dir, r)["model"]]
    plain, _, _ = _mlp_stack()
    pieces.fill([pieces.Slot(n, 0, t.view(-1)) for n, t in plain.state_dict().items()], saved)
    expected = model.state_dict()
    assert all(torch.equal(plain.state_dict()[k], expected[k]) for k in expected)
    fresh, blocks, _ = _mlp_stack()
    _shard(shardwise.fully_shard, fresh, blocks, None, MixedPrecisionPolicy(), "MLPStack")
    with torch.no_grad():
        pieces.fill(fresh.checkpoint_slots(), saved)
    assert _max_diff(fresh.state_dict(), expected) == 0
    dist.barrier()
    if rank == 0:
        shutil.rmtree(directory)


def fully_shard_state_dict_round_trips_through_torch_distributed_checkpoint(rank, world, gloo):
    """FSDP2's checkpoint recipe, unchanged: dcp.save(model.state_dict()) of a sharded model, then
    dcp.load into a model sharded from another seed and load_state_dict: its loss and state
    equal the saved model's. The tensors are whole (each rank's state dict gathers them; DCP
    writes them once), where torch's fully_shard hands DCP DTensor shards. Catches a state dict
    DCP cannot plan, and a load that leaves the fresh model's own values anywhere."""
    import shutil

    import torch.distributed.checkpoint as dcp

    model, blocks, make = _mlp_stack()
    _shard(shardwise.fully_shard, model, blocks, None, MixedPrecisionPolicy(), "MLPStack")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)  # each rank scales its pieces: not the seed's values any more
    path = f"/tmp/shardwise-fully-shard-dcp-{os.environ['MASTER_PORT']}"
    dcp.save(model.state_dict(), checkpoint_id=path)
    torch.manual_seed(1)
    fresh, fresh_blocks, _ = _mlp_stack()
    for p in fresh.parameters():
        torch.nn.init.normal_(p)
    _shard(shardwise.fully_shard, fresh, fresh_blocks, None, MixedPrecisionPolicy(), "MLPStack")
    assert _max_diff(fresh.state_dict(), model.state_dict()) > 0
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=path)
    fresh.load_state_dict(state)
    assert _max_diff(fresh.state_dict(), model.state_dict()) == 0
    x = make(0)
    assert torch.equal(fresh(x), model(x))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path)


def fully_shard_bad_input_is_refused_before_any_work(rank, world, gloo):
    """Wrong inputs name the argument and the fix, and leave the model untouched: a module
    sharded twice, a mesh that is not a DeviceMesh, FSDP1's MixedPrecision for mp_policy, an
    offload policy of the wrong type, a reshard_after_forward that is no factor of the world or
    no int, a shard_placement_fn."""
    from torch.distributed.fsdp import MixedPrecision

    model, _, _ = _mlp_stack()
    before = [p.detach().clone() for p in model.parameters()]
    bad = [
        ({"mesh": (world,)}, TypeError, "mesh must be a DeviceMesh"),
        (
            {"mp_policy": MixedPrecision(param_dtype=torch.bfloat16)},
            TypeError,
            "MixedPrecisionPolicy",
        ),
        ({"offload_policy": True}, TypeError, "CPUOffloadPolicy"),
        ({"reshard_after_forward": 3}, ValueError, "factor of the shard group's size"),
        ({"reshard_after_forward": "2"}, ValueError, "True, False, None, or an int"),
        ({"shard_placement_fn": lambda p: None}, ValueError, "drop the argument"),
    ]
    for kwargs, kind, match in bad:
        with pytest.raises(kind, match=match):
            shardwise.fully_shard(model, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert not isinstance(model, shardwise.FSDPModule)
    shardwise.fully_shard(model[0])
    with pytest.raises(ValueError, match="already sharded by fully_shard"):
        shardwise.fully_shard(model[0])
    with pytest.raises(TypeError, match="nn.Module"):
        shardwise.fully_shard("model")


def _stats():
    from shardwise import _C

    stats = _C.communication_stats()
    return {k: stats.get(k, {}).get("calls", 0) for k in ("all_gather", "reduce_scatter")}


def _sharded_stack(**root):
    model, blocks, make = _mlp_stack()
    for block in blocks:
        shardwise.fully_shard(block)
    return shardwise.fully_shard(model, **root), make


def fully_shard_methods_change_what_runs(rank, world, gloo):
    """FSDP2's FSDPModule methods, each seen in what the backend runs (communication_stats) or
    what the module holds: set_requires_gradient_sync(False) reduces nothing and the next synced
    backward gives the gradient of both batches; set_reshard_after_backward(False) makes the next
    forward gather nothing; unshard() / reshard() register full / sharded parameters; the root
    keeps its parameters after forward unless reshard_after_forward=True; a forward prefetch
    list starts the next block's all-gather inside the first block's forward. Catches each
    accepted and ignored."""
    x0, x1 = torch.randn(4, 16), torch.randn(4, 16)
    model, _ = _sharded_stack()
    model.set_requires_gradient_sync(False)
    before = _stats()
    model(x0).pow(2).mean().backward()
    assert _stats()["reduce_scatter"] == before["reduce_scatter"], "no_sync reduced"
    model.set_requires_gradient_sync(True)
    model(x1).pow(2).mean().backward()
    assert _stats()["reduce_scatter"] == before["reduce_scatter"] + 3  # the blocks; root empty
    both, _ = _sharded_stack()
    (both(x0).pow(2).mean() + both(x1).pow(2).mean()).backward()
    assert _max_diff(_full_grads(model), _full_grads(both)) <= 1e-6

    model, _ = _sharded_stack()
    model.set_reshard_after_backward(False)
    model(x0).sum().backward()
    before = _stats()
    model(x1)
    assert _stats()["all_gather"] == before["all_gather"], "gathered parameters re-gathered"

    model, _ = _sharded_stack()
    block = model[1]
    shard_shapes = [p.shape for p in block.parameters()]
    block.unshard()
    assert [p.shape for p in block.parameters()] == [(64, 16), (64,), (16, 64), (16,)]
    block.reshard()
    assert [p.shape for p in block.parameters()] == shard_shapes

    def root_keeps(**kwargs):
        torch.manual_seed(0)
        inner = nn.Linear(16, 16)
        root = shardwise.fully_shard(
            nn.Sequential(shardwise.fully_shard(inner), nn.Linear(16, 4)), **kwargs
        )
        root(x0)
        return root[1].weight.shape == (4, 16), inner.weight.shape == (16, 16)

    assert root_keeps() == (True, False)
    assert root_keeps(reshard_after_forward=True) == (False, False)

    seen = []
    for prefetch in (False, True):
        model, _ = _sharded_stack()
        if prefetch:
            model[0].set_modules_to_forward_prefetch([model[1]])
        model[0].in_proj.register_forward_pre_hook(lambda *_: seen.append(_stats()["all_gather"]))
        start = _stats()["all_gather"]
        model(x0)
        seen[-1] -= start
    assert seen == [1, 2], seen  # block 0's (the root holds no parameter); and block 1's


def fully_shard_int_reshard_after_forward_matches_torchs(rank, world, gloo):
    """FSDP2's int reshard_after_forward N: after forward a block keeps its share of a group of N
    consecutive ranks; backward all-gathers over those N. At world 4 with N = 2, on torch's test
    models: losses, gradients and state equal torch's fully_shard(reshard_after_forward=2) over
    gloo within 1e-6; between forward and backward a block holds 1 + W/N shards' bytes; backward's
    all-gathers advance the N-group's sequence once per block and the world's by the
    reduce-scatters only. At world 2, N = 2 is True and N = 1 is False, with FSDP2's warning.
    Catches the wrong blocks kept (wrong gradients), backward gathering over the whole group
    again, and the int accepted and read as True."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    x = torch.randn(4, 16)
    if world == 2:
        model, _ = _sharded_stack()
        for n, keeps in ((2, False), (1, True)):
            block = shardwise.fully_shard(nn.Linear(16, 16), reshard_after_forward=n)
            root = shardwise.fully_shard(nn.Sequential(block, nn.ReLU()))
            root(x)
            assert (block.weight.shape == (16, 16)) == keeps, n
        with pytest.warns(UserWarning, match="reshard_after_forward=1"):
            shardwise.fully_shard(nn.Linear(4, 4), reshard_after_forward=1)
        return
    torch_mesh = DeviceMesh.from_group(gloo, "cpu")
    for name in ("MLPStack", "Transformer"):
        ref = _run(name, fully_shard, torch_mesh, MixedPrecisionPolicy(), reshard=2)
        ours = _run(name, shardwise.fully_shard, None, MixedPrecisionPolicy(), reshard=2)
        _assert_matches(ours, ref, name)

    model, blocks, make = _mlp_stack()
    _shard(shardwise.fully_shard, model, blocks, None, MixedPrecisionPolicy(), "", reshard=2)
    units = [shardwise.fsdp.fsdp2._state_of(b) for b in blocks]
    sharded = [u.unit.sharded_param_bytes() for u in units]
    small, whole = units[0].unit.post_forward_group(), dist.group.WORLD
    assert dist.get_world_size(small) == 2 and rank in dist.get_process_group_ranks(small)
    model(make(0)).pow(2).mean().backward()  # the first backward also checks the order
    loss = model(make(1)).pow(2).mean()
    assert all(u.unit.holds_post_forward_shard() for u in units)
    assert [u.unit.sharded_param_bytes() for u in units] == [b * (1 + world // 2) for b in sharded]
    before = small._get_sequence_number_for_group(), whole._get_sequence_number_for_group()
    loss.backward()
    after = small._get_sequence_number_for_group(), whole._get_sequence_number_for_group()
    moved = (after[0] - before[0], after[1] - before[1])
    assert moved == (len(blocks), len(blocks)), moved
    assert [u.unit.sharded_param_bytes() for u in units] == sharded


def fully_shard_offloads_to_cpu_with_torchs_policy(rank, world, gloo):
    """CPUOffloadPolicy keeps the shards in CPU memory and trains as without it (on a CPU-only
    machine nothing moves, so the losses are equal); pin_memory pins them only where a GPU
    computes. Catches the policy type check passing a policy nothing reads."""
    losses = {}
    for offload in (None, CPUOffloadPolicy(pin_memory=True)):
        model, blocks, make = _mlp_stack()
        kwargs = {} if offload is None else {"offload_policy": offload}
        for block in blocks:
            shardwise.fully_shard(block, **kwargs)
        shardwise.fully_shard(model, **kwargs)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for step in range(2):
            loss = model(make(step)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        losses[offload is None] = out
        state = shardwise.fsdp.fsdp2._state_of(model[0])
        assert state.unit.pinned() == (offload is not None and torch.cuda.is_available())
    assert losses[True] == losses[False]


def fully_shard_clip_grad_norm_is_torchs_over_its_dtensors(rank, world, gloo):
    """Catches a gradient norm taken over this rank's pieces only, or a clip that scales the
    wrong gradients: after one backward of torch's Transformer, FSDPModule.clip_grad_norm_
    returns the norm torch's clip_grad_norm_ computes over FSDP2's DTensors (within 1e-5 of
    its size), and the clipped full gradients agree within 1e-6."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    policy, max_norm, norms, grads = MixedPrecisionPolicy(), 0.05, {}, {}
    for api, mesh in ((fully_shard, DeviceMesh.from_group(gloo, "cpu")),
                      (shardwise.fully_shard, None)):  # fmt: skip
        model, blocks, make = _transformer()
        model = _shard(api, model, blocks, mesh, policy, "Transformer")
        _loss(model, make(0), "Transformer").backward()
        if api is fully_shard:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).full_tensor()
        else:
            norm = model.clip_grad_norm_(max_norm)
        norms[api], grads[api] = float(norm), _full_grads(model)
    ours, theirs = norms[shardwise.fully_shard], norms[fully_shard]
    assert theirs > max_norm, theirs  # the clip acts
    assert abs(ours - theirs) <= 1e-5 * theirs, (ours, theirs)
    assert _max_diff(grads[shardwise.fully_shard], grads[fully_shard]) <= 1e-6


FULLY_SHARD_CHECKS = [f for n, f in sorted(globals().items()) if n.startswith("fully_shard_")]
