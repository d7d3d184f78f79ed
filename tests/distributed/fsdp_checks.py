"""FSDP checks run inside a world of worker processes (see worker.py): shardwise FSDP against
single-process training of the same model on the same global batch, against torch FSDP2, and
its error paths. Every rank also trains the reference locally, so no results travel."""

import copy
import math

import shardwise
import torch
import torch.distributed as dist
import torch.nn.functional as F
from fsdp_effect_checks import EFFECT_CHECKS
from fsdp_fidelity_checks import CHECKS as FIDELITY_CHECKS
from fsdp_optim_state_checks import CHECKS as OPTIM_STATE_CHECKS
from fully_shard_checks import FULLY_SHARD_CHECKS
from torch import nn

STEPS = 20
VOCAB, DIM, SEQ, BATCH_PER_RANK = 64, 32, 12, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyGPT(nn.Module):
    """Embedding, blocks in a ModuleList, a head tied to the embedding, uneven sizes."""

    def __init__(self, layers=3):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.layers = nn.ModuleList(Block() for _ in range(layers))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def make_model(seed=0):
    torch.manual_seed(seed)
    return TinyGPT()


def global_batch(step, world):
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (BATCH_PER_RANK * world, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def local(batch, rank):
    return tuple(t[rank * BATCH_PER_RANK : (rank + 1) * BATCH_PER_RANK] for t in batch)


def loss_of(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def optimizer_for(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def train_reference(world, steps=STEPS, param_dtype=None, device="cpu"):
    """Single process, global batch; with param_dtype, forward/backward in that dtype from an
    fp32 master copy (what FSDP mixed precision computes), the optimizer in fp32."""
    model = make_model().to(device)
    opt = optimizer_for(model)
    losses = []
    for step in range(steps):
        inputs, targets = (t.to(device) for t in global_batch(step, world))
        if param_dtype is None:
            loss = loss_of(model, inputs, targets)
            loss.backward()
        else:
            low = copy.deepcopy(model).to(param_dtype)
            loss = loss_of(low, inputs, targets)
            loss.backward()
            for p, q in zip(model.parameters(), low.parameters(), strict=True):
                p.grad = q.grad.float()
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, model


def train_fsdp(rank, world, steps=STEPS, **kwargs):
    wrap = kwargs.pop("wrap", None) or [f"layers.{i}" for i in range(3)]
    seed = kwargs.pop("model_seed", 0)
    model = shardwise.FullyShardedDataParallel(make_model(seed), wrap=wrap, **kwargs)
    opt = optimizer_for(model)
    losses = []
    for step in range(steps):
        loss = loss_of(model, *local(global_batch(step, world), rank))
        loss.backward()
        losses.append(_global_mean(loss.detach()))
        opt.step()
        opt.zero_grad()
    return losses, model


def _global_mean(loss):
    total = loss.clone().float()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def assert_close_rel(ours, ref, rel, what):
    """Relative error of a loss curve (per element) or a tensor (as a whole: the norm of the
    difference over the norm of the reference, so elements near zero do not dominate)."""
    ours, ref = torch.as_tensor(ours).double(), torch.as_tensor(ref).double()
    if ours.dim() == 1 and what.startswith("losses"):
        err = ((ours - ref).abs() / ref.abs()).max().item()
    else:
        err = ((ours - ref).norm() / ref.norm().clamp_min(1e-12)).item()
    assert err <= rel, f"{what}: relative error {err:.3e} > {rel:.1e}"


def compare_params(fsdp_model, reference, rel, what):
    full = fsdp_model.state_dict()
    ref = reference.state_dict()
    assert set(full) == set(ref), f"{what}: keys {sorted(set(full) ^ set(ref))} differ"
    for name, tensor in ref.items():
        assert full[name].shape == tensor.shape, f"{what}: {name} shape"
        assert_close_rel(full[name], tensor, rel, f"{what}: {name}")


def _parity(rank, world, **kwargs):
    ref_losses, ref_model = train_reference(world)
    losses, model = train_fsdp(rank, world, **kwargs)
    assert_close_rel(losses, ref_losses, 1e-5, "losses")
    compare_params(model, ref_model, 1e-5, "parameters")


def fsdp_full_shard_matches_single_process(rank, world, gloo):
    """Sharding layout, all-gather/reduce-scatter, gradient divide factors, tied weights:
    any mistake shows as a loss or parameter that drifts from single-process training."""
    _parity(rank, world, sharding_strategy="full_shard")


def fsdp_shard_grad_op_matches_single_process(rank, world, gloo):
    """Keeping units unsharded between forward and backward (no re-gather) stays exact."""
    _parity(rank, world, sharding_strategy="shard_grad_op")


def fsdp_no_shard_matches_single_process(rank, world, gloo):
    """no_shard = replicate + all-reduce: exact against single-process training."""
    _parity(rank, world, sharding_strategy="no_shard")


def fsdp_hybrid_shard_matches_single_process(rank, world, gloo):
    """hybrid_shard: reduce-scatter in the shard group then all-reduce across replicas."""
    mesh = (2, world // 2) if world % 2 == 0 and world > 2 else (1, world)
    _parity(rank, world, sharding_strategy="hybrid_shard", mesh=mesh)


def fsdp_owned_slices_tile_every_parameter(rank, world, gloo):
    """units() and owned_slices() (the ownership the trainer's checkpoints and ZeRO-3 read):
    catches a slice whose start or length disagrees with the data the rank really holds, ranks
    whose slices overlap or leave a gap, and a unit list that misses a unit. Hybrid
    sharding too: there the slices cut each parameter over the shard group, not the world."""
    for kwargs in ({}, {"sharding_strategy": "hybrid_shard", "mesh": (2, world // 2)}):
        if kwargs and world < 4:
            continue
        reference = make_model()
        full = dict(reference.named_parameters())
        wrap = [f"layers.{i}" for i in range(3)]
        model = shardwise.FullyShardedDataParallel(make_model(), wrap=wrap, **kwargs)
        assert sorted(model.units()) == sorted([*wrap, "<root>"]), model.units()
        slices = model.owned_slices()
        assert [s.name for s in slices] == [
            s.name for u in range(len(model.units())) for s in model.owned_slices(u)
        ]
        assert sorted(s.name for s in slices) == sorted(full), "every parameter once"
        shard_size = world // 2 if kwargs else world
        covered = {}
        for s in slices:
            expected = full[s.name].detach().reshape(-1)[s.start : s.start + s.valid]
            assert s.numel == full[s.name].numel() and s.parameter.numel() == s.valid, s
            assert torch.equal(s.parameter.detach().reshape(-1), expected), s.name
            covered[s.name] = (s.start, s.valid)
        gathered = [None] * world
        dist.all_gather_object(gathered, covered)
        group_ranks = [r for r in range(world) if r // shard_size == rank // shard_size]
        for name, p in full.items():
            pieces = sorted(gathered[r][name] for r in group_ranks)
            cursor = 0
            for start, valid in pieces:
                if valid:
                    assert start == cursor, (name, pieces)
                    cursor += valid
            assert cursor == p.numel(), (name, pieces)


def fsdp_prefetch_offload_checkpointing_match(rank, world, gloo):
    """Forward prefetch, BACKWARD_POST, CPU offload of shards and activation checkpointing
    change when things happen, never the numbers; sync_module_states makes ranks that built
    different models start from rank 0's."""
    _parity(
        rank,
        world,
        model_seed=rank,
        sync_module_states=True,
        forward_prefetch=True,
        backward_prefetch="backward_post",
        cpu_offload=True,
        activation_checkpointing=True,
    )


def fsdp_frozen_parameters_mix_in_a_unit(rank, world, gloo):
    """A unit holding frozen and trainable parameters: the frozen ones stay put, get no
    gradient, and the trainable ones still match single-process training."""

    def freeze(model):
        for p in list(model.layers[1].norm.parameters()) + [model.pos]:
            p.requires_grad_(False)
        return model

    ref = freeze(make_model())
    ref_opt = optimizer_for(ref)
    model = shardwise.FullyShardedDataParallel(freeze(make_model()), wrap=["layers.1"])
    opt = optimizer_for(model)
    for step in range(5):
        batch = global_batch(step, world)
        loss_of(ref, *batch).backward()
        loss_of(model, *local(batch, rank)).backward()
        for o in (ref_opt, opt):
            o.step()
            o.zero_grad()
    compare_params(model, ref, 1e-5, "frozen + trainable")
    loss_of(model, *local(global_batch(0, world), rank)).backward()
    inner = model.module
    assert inner.pos.grad is None and inner.layers[1].norm.weight.grad is None, "frozen got grad"
    assert inner.layers[1].up.weight.grad is not None, "trainable parameter lost its gradient"
    assert torch.equal(model.state_dict()["pos"], make_model().pos.detach())


def fsdp_over_gloo_matches_single_process(rank, world, gloo):
    """The engine only uses c10d collectives: gloo works too (its reduce-scatter included)."""
    _parity(rank, world, process_group=gloo)


def fsdp_bf16_within_derived_tolerance(rank, world, gloo):
    """bf16 compute with fp32 master shards and fp32 reduction: the error against fp32 training
    is at most 2x (plus 1e-3 of slack) that of the same bf16 recipe run in one process."""
    ref_losses, ref_model = train_reference(world)
    bf_losses, bf_model = train_reference(world, param_dtype=torch.bfloat16)
    losses, model = train_fsdp(rank, world, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    torch_err = max(abs(a - b) for a, b in zip(bf_losses, ref_losses, strict=True))
    our_err = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    assert our_err <= 2 * torch_err + 1e-3, f"loss error {our_err:.3e} vs torch {torch_err:.3e}"
    full, ref, bf = model.state_dict(), ref_model.state_dict(), bf_model.state_dict()
    for name in ref:
        torch_perr = (bf[name] - ref[name]).abs().max().item()
        our_perr = (full[name] - ref[name]).abs().max().item()
        assert our_perr <= 2 * torch_perr + 1e-3, f"{name}: {our_perr:.3e} vs {torch_perr:.3e}"


def _train_wrapped(rank, world, model, steps=6):
    opt = optimizer_for(model)
    losses = []
    for step in range(steps):
        loss = loss_of(model, *local(global_batch(step, world), rank))
        loss.backward()
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, model.state_dict()


def fsdp_torch_fsdp_arguments_train_like_their_shardwise_spelling(rank, world, gloo):
    """torch FSDP's arguments, torch's objects (ModuleWrapPolicy, ShardingStrategy,
    BackwardPrefetch, MixedPrecision, CPUOffload, device_id, and a transformer_auto_wrap_policy
    partial), train bit for bit like shardwise's own spelling of the same setup: catches an
    object read as another setting (a dtype, the prefetch, the units)."""
    import functools

    from torch.distributed.fsdp import (
        BackwardPrefetch,
        CPUOffload,
        MixedPrecision,
        ShardingStrategy,
    )
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, transformer_auto_wrap_policy

    fsdp = shardwise.FullyShardedDataParallel
    fsdp_args = {
        "auto_wrap_policy": ModuleWrapPolicy({Block}),
        "sharding_strategy": ShardingStrategy.FULL_SHARD,
        "backward_prefetch": BackwardPrefetch.BACKWARD_PRE,
        "mixed_precision": MixedPrecision(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.float32
        ),
        "device_id": torch.device("cpu"),
    }
    ours = {
        "wrap": [f"layers.{i}" for i in range(3)],
        "sharding_strategy": "full_shard",
        "backward_prefetch": "backward_pre",
        "param_dtype": torch.bfloat16,
        "reduce_dtype": torch.float32,
        "buffer_dtype": torch.float32,
    }
    a = _train_wrapped(rank, world, fsdp(make_model(), **fsdp_args))
    b = _train_wrapped(rank, world, fsdp(make_model(), **ours))
    assert a[0] == b[0], (a[0], b[0])
    assert all(torch.equal(a[1][n], b[1][n]) for n in b[1])
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    c = _train_wrapped(
        rank,
        world,
        fsdp(
            make_model(),
            auto_wrap_policy=policy,
            sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
            backward_prefetch=BackwardPrefetch.BACKWARD_POST,
            cpu_offload=CPUOffload(offload_params=True),
        ),
    )
    d = _train_wrapped(
        rank,
        world,
        fsdp(
            make_model(),
            wrap=[f"layers.{i}" for i in range(3)],
            sharding_strategy="shard_grad_op",
            backward_prefetch="backward_post",
            cpu_offload=True,
        ),
    )
    assert c[0] == d[0], (c[0], d[0])


def fsdp_matches_torch_fsdp2(rank, world, gloo):
    """Same model, same data, torch's fully_shard over gloo: the same losses and parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch_model = make_model()
    mesh = init_device_mesh("cpu", (world,))
    for layer in torch_model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(torch_model, mesh=mesh)
    opt = optimizer_for(torch_model)
    torch_losses = []
    for step in range(STEPS):
        loss = loss_of(torch_model, *local(global_batch(step, world), rank))
        loss.backward()
        torch_losses.append(_global_mean(loss.detach()))
        opt.step()
        opt.zero_grad()
    losses, model = train_fsdp(rank, world)
    assert_close_rel(losses, torch_losses, 1e-5, "losses vs FSDP2")
    ours = model.state_dict()
    for name, tensor in torch_model.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        assert_close_rel(ours[name], full, 1e-5, f"{name} vs FSDP2")


def fsdp_memory_scales_as_one_over_n(rank, world, gloo):
    """Parameters, gradients and AdamW state per rank, counted from tensor storages: 1/N of the
    model for full_shard (within the alignment padding), 1/shards for hybrid_shard, the whole
    model for no_shard."""
    total = sum(p.numel() for p in make_model().parameters()) * 4
    layouts = [("full_shard", None, 1 / world), ("no_shard", None, 1.0)]
    if world == 4:
        layouts.append(("hybrid_shard", (2, 2), 1 / 2))
    for strategy, mesh, share in layouts:
        losses, model = train_fsdp(rank, world, steps=1, sharding_strategy=strategy, mesh=mesh)
        mem = model.memory_bytes()
        params_in_units = sum(1 for _ in model.parameters())
        padding = params_in_units * 16 * 4 if share < 1 else 0
        opt = optimizer_for(model)
        loss_of(model, *local(global_batch(0, world), rank)).backward()
        opt.step()
        state = sum(
            t.untyped_storage().nbytes()
            for s in opt.state.values()
            for t in s.values()
            if torch.is_tensor(t) and t.dim() > 0
        )
        for what, got, factor in (
            ("parameters", mem["parameters"], 1),
            ("gradients", mem["gradients"], 1),
            ("AdamW state", state, 2),
        ):
            # Ranks hold 1/N of every parameter up to its padding: the last ranks hold less.
            low, high = factor * (total * share - padding), factor * (total * share + padding)
            assert low <= got <= high, f"{strategy} {what}: {got} bytes, expected [{low}, {high}]"


def fsdp_no_sync_accumulates_like_one_big_batch(rank, world, gloo):
    """Two micro-batches under no_sync then one synced give the gradient of all three batches
    (checked through an SGD step: Adam's first step divides by |g| and would magnify rounding
    differences of near-zero gradients)."""
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    model = shardwise.FullyShardedDataParallel(make_model(), wrap=["layers.0", "layers.2"])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for micro in range(3):
        batch = global_batch(micro, world)
        (loss_of(ref, *batch) / 3).backward()
        if micro < 2:
            with model.no_sync():
                (loss_of(model, *local(batch, rank)) / 3).backward()
        else:
            (loss_of(model, *local(batch, rank)) / 3).backward()
    ref_opt.step()
    opt.step()
    compare_params(model, ref, 1e-5, "after accumulation")


def fsdp_clip_grad_norm_matches_torch(rank, world, gloo):
    """The global norm over shards equals torch's clip_grad_norm_ on the whole model."""
    ref = make_model()
    model = shardwise.FullyShardedDataParallel(make_model(), wrap=["layers.1"])
    batch = global_batch(0, world)
    loss_of(ref, *batch).backward()
    loss_of(model, *local(batch, rank)).backward()
    for norm_type in (2.0, math.inf):
        expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05, norm_type)
        got = model.clip_grad_norm_(0.05, norm_type)
        assert_close_rel(got, expected, 1e-5, f"norm {norm_type}")
    for p in model.parameters():  # the clipped gradients themselves, through an update
        p.data.sub_(p.grad)
    for p in ref.parameters():
        p.data.sub_(p.grad)
    compare_params(model, ref, 1e-5, "after clipped update")


def fsdp_state_dicts_round_trip_and_reshard(rank, world, gloo):
    """full_state_dict loads into the plain model and into a model sharded over a group of a
    different size; sharded and local state dicts restore a model exactly at the same size."""
    losses, model = train_fsdp(rank, world, steps=2)
    full = model.state_dict()
    plain = make_model(seed=5)
    plain.load_state_dict(full)
    groups = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    alone = groups[rank]
    solo = shardwise.FullyShardedDataParallel(make_model(seed=7), process_group=alone)
    solo.load_state_dict(full)
    for name, tensor in solo.state_dict().items():
        assert torch.equal(tensor, full[name]), f"world-1 reload: {name}"
    for kind in ("sharded_state_dict", "local_state_dict"):
        model.state_dict_type = kind
        saved = model.state_dict()
        other = shardwise.FullyShardedDataParallel(
            make_model(seed=9), wrap=[f"layers.{i}" for i in range(3)], state_dict_type=kind
        )
        other.load_state_dict(saved)
        other.state_dict_type = "full_state_dict"
        for name, tensor in other.state_dict().items():
            assert torch.equal(tensor, full[name]), f"{kind}: {name}"
    model.state_dict_type = "full_state_dict"


def fsdp_bad_configs_fail_before_any_collective(rank, world, gloo):
    """Unknown keys/values, a tied parameter split across units and a mesh that does not match
    the world size are rejected with messages naming the fix, before communicating."""
    import pytest_like as check

    base = {"use_fsdp": True, "fsdp_sharding_strategy": "full_shard"}
    check.raises(
        shardwise.fsdp.ConfigError,
        "did you mean 'fsdp_sharding_strategy'",
        lambda: shardwise.wrap(make_model(), {**base, "fsdp_sharding_stratgy": "full_shard"}),
    )
    check.raises(
        shardwise.fsdp.ConfigError,
        "valid values: full_shard, shard_grad_op, no_shard, hybrid_shard",
        lambda: shardwise.wrap(make_model(), {**base, "fsdp_sharding_strategy": "zero3"}),
    )
    check.raises(
        ValueError,
        "shared (tied) parameter must live in one unit",
        lambda: shardwise.FullyShardedDataParallel(make_model(), wrap=["embed"]),
    )
    check.raises(
        ValueError,
        "does not match the world size",
        lambda: shardwise.FullyShardedDataParallel(
            make_model(), sharding_strategy="hybrid_shard", mesh=(3, world)
        ),
    )


def fsdp_wrap_checks_the_launch_keys_against_the_group(rank, world, gloo):
    """The distributed config's launch keys given to shardwise.wrap: rank, world_size,
    num_nodes x num_processes_per_node and backend that disagree with the process group are
    refused naming the key; local_rank, master_addr and master_port, which only the launcher
    reads, are named in a warning. Catches them dropped without a word (a config written for
    another launch wrapping silently)."""
    import warnings

    import pytest_like as check

    base = {"use_fsdp": True}
    for key, value in (
        ("rank", rank + 1),
        ("world_size", world + 1),
        ("backend", "mpi"),
    ):
        check.raises(
            shardwise.fsdp.ConfigError,
            f"{key}={value}",
            lambda key=key, value=value: shardwise.wrap(make_model(), {**base, key: value}),
        )
    check.raises(
        shardwise.fsdp.ConfigError,
        "num_nodes x num_processes_per_node",
        lambda: shardwise.wrap(
            make_model(), {**base, "num_nodes": 2, "num_processes_per_node": world}
        ),
    )
    launch = {"rank": rank, "world_size": world, "backend": dist.get_backend()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shardwise.wrap(make_model(), {**base, **launch, "master_addr": "h", "local_rank": 0})
    named = [str(w.message) for w in caught if "ignored by shardwise.wrap" in str(w.message)]
    assert len(named) == 1 and "local_rank, master_addr" in named[0], named


def fsdp_seed_config_block_trains(rank, world, gloo):
    """The distributed: block of the FSDP guide, verbatim (bf16 mixed precision,
    transformer_auto_wrap), wraps and trains: the loss falls."""
    config = {
        "use_fsdp": True,
        "fsdp_sharding_strategy": "full_shard",
        "fsdp_backward_prefetch": "backward_pre",
        "fsdp_forward_prefetch": False,
        "fsdp_auto_wrap_policy": "transformer_auto_wrap",
        "fsdp_min_num_params": 1000000,
        "fsdp_state_dict_type": "full_state_dict",
        "fsdp_mixed_precision": True,
        "fsdp_param_dtype": "bfloat16",
        "fsdp_reduce_dtype": "float32",
        "fsdp_buffer_dtype": "float32",
    }
    model = shardwise.wrap(make_model(), config)
    assert len(model._unit_params) == 4, "three blocks and the root"
    opt = optimizer_for(model)
    inputs, targets = global_batch(0, world)
    losses = []
    for _ in range(10):
        loss = loss_of(model, *local((inputs, targets), rank))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(_global_mean(loss.detach()))
    assert losses[-1] < 0.8 * losses[0], f"loss did not fall: {losses}"


def fsdp_forward_order_mismatch_is_reported(rank, world, gloo):
    """Ranks that run the units in different orders get an error naming the first differing
    unit after the first iteration (equal-size units, so the collectives themselves match)."""
    model = shardwise.FullyShardedDataParallel(make_model(), wrap=["layers.0", "layers.1"])
    inner = model.module
    order = [0, 1] if rank == 0 else [1, 0]
    original = TinyGPT.forward

    def swapped(self, tokens):
        x = self.embed(tokens) + self.pos
        for i in order:
            x = self.layers[i](x)
        x = self.layers[2](x)
        return self.head(self.norm(x))

    inner.forward = swapped.__get__(inner)
    try:
        loss_of(model, *local(global_batch(0, world), rank)).backward()
    except RuntimeError as error:
        assert "forward order differs across ranks" in str(error), str(error)
        assert "layers.0" in str(error) or "layers.1" in str(error), str(error)
    else:
        raise AssertionError("no error for a rank-dependent forward order")
    finally:
        inner.forward = original.__get__(inner)


# torch FSDP fidelity (MixedPrecision on torch's own test model, config keys that take effect):
# fsdp_fidelity_checks.py, run in these worlds
CHECKS = [f for n, f in sorted(globals().items()) if n.startswith("fsdp_")]
CHECKS += FIDELITY_CHECKS + EFFECT_CHECKS + FULLY_SHARD_CHECKS + OPTIM_STATE_CHECKS
