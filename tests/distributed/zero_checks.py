"""ZeRO checks run inside a world of worker processes (see worker.py): every stage against
single-process torch.optim.AdamW on the same global batch, stage 1 against torch's
ZeroRedundancyOptimizer, the fp16 loss scaler, memory per rank against the ZeRO formulas, and
optimizer checkpoints that load at another world size."""

import functools
import os
from pathlib import Path

import shardwise.optim
import shardwise.zero
import torch
import torch.distributed as dist
import torch.nn.functional as F
from fsdp_checks import (
    BATCH_PER_RANK,
    _global_mean,
    assert_close_rel,
    global_batch,
    local,
    loss_of,
    make_model,
)
from torch import nn

STEPS = 20
LR, WD = 1e-2, 0.1


def zero_config(stage, world, accumulation=1, **extra):
    return {
        "train_micro_batch_size_per_gpu": BATCH_PER_RANK // accumulation,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
        **extra,
    }


@functools.cache  # read only: every parity check of one world shares its references
def train_reference(world, steps=STEPS, sgd=False, clip=0.0, dtype=torch.float32):
    model = make_model().to(dtype)
    if sgd:
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, nesterov=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    losses = []
    for step in range(steps):
        inputs, targets = global_batch(step, world)
        logits = model(inputs).to(dtype)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, model


def train_zero(engine, rank, world, steps, first=0):
    accumulation = engine.accumulation
    losses = []
    for step in range(first, first + steps):
        inputs, targets = local(global_batch(step, world), rank)
        micro = inputs.shape[0] // accumulation
        total = 0.0
        for k in range(accumulation):
            part = slice(k * micro, (k + 1) * micro)
            loss = loss_of(engine, inputs[part], targets[part])
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        losses.append(_global_mean(total / accumulation))
    return losses


def _parity(rank, world, stage, accumulation=1, sgd=False, clip=0.0, offload=False, **extra):
    """Our losses against single-process fp32 torch, our parameters against float64 torch:
    averaging the ranks' gradients is a reduction, so the bound is 2x torch's own fp32 error vs
    float64 (largest over the tensors), never below 1e-6. A wrong divide factor, piece offset or
    clip coefficient drifts by orders of magnitude more."""
    ref_losses, ref_model = train_reference(world, sgd=sgd, clip=clip)
    exact = train_reference(world, sgd=sgd, clip=clip, dtype=torch.float64)[1].state_dict()
    rel = max(1e-6, 2 * max(_rel(t, exact[n]) for n, t in ref_model.state_dict().items()))
    config = zero_config(stage, world, accumulation, gradient_clipping=clip, **extra)
    if sgd:
        config["optimizer"] = {
            "type": "SGD",
            "params": {"lr": LR, "momentum": 0.9, "nesterov": True, "weight_decay": 0.0},
        }
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    engine = shardwise.zero.initialize(make_model(), config)
    losses = train_zero(engine, rank, world, STEPS)
    assert_close_rel(losses, ref_losses, rel, f"stage {stage} losses")
    ours = engine.module.state_dict()
    for name, tensor in exact.items():
        assert_close_rel(ours[name], tensor, rel, f"stage {stage} vs float64: {name}")


def _rel(ours, ref):
    ours, ref = ours.double(), ref.double()
    return ((ours - ref).norm() / ref.norm().clamp_min(1e-12)).item()


def zero_stage0_matches_single_process(rank, world, gloo):
    """Stage 0 (all-reduce, unpartitioned state): gradient averaging and the fused AdamW."""
    _parity(rank, world, 0)


def zero_stage1_matches_single_process(rank, world, gloo):
    """Stage 1: partition layout, reduce-scatter into partitions, all-gather of the updated
    parameters; a wrong piece offset or divide factor drifts from the reference."""
    _parity(rank, world, 1)


def zero_stage2_matches_single_process(rank, world, gloo):
    """Stage 2: bucketed reduce-scatter during backward (hooks, bucket order, release of .grad)."""
    _parity(rank, world, 2)


def zero_lamb_matches_single_process_lamb(rank, world, gloo):
    """DeepSpeed's "type": "Lamb" at stages 1, 2 and 3 against shardwise.optim.FusedLamb on the
    whole model in one process (itself checked against a reference LAMB): each parameter's
    trust ratio takes the norms over all its pieces, on every rank; a ratio taken from a rank's
    own piece, or a piece counted twice, changes the steps. Clamping is on (max_coeff 0.5)."""
    hp = {"lr": LR, "weight_decay": WD, "max_coeff": 0.5, "min_coeff": 0.01}
    model = make_model()
    opt = shardwise.optim.FusedLamb(model.parameters(), **hp)
    ref = []
    for step in range(STEPS):
        inputs, targets = global_batch(step, world)
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        ref.append(loss.item())
        opt.step()
        opt.zero_grad()
    for stage in (1, 2, 3):
        config = zero_config(stage, world, optimizer={"type": "Lamb", "params": hp})
        engine = shardwise.zero.initialize(make_model(), config)
        losses = train_zero(engine, rank, world, STEPS)
        assert_close_rel(losses, ref, 1e-5, f"stage {stage} Lamb losses")
        ours = engine.module.state_dict()
        for name, tensor in model.state_dict().items():
            assert_close_rel(ours[name], tensor, 1e-5, f"stage {stage} Lamb: {name}")


def zero_allgather_bucket_size_sets_the_parameter_all_gathers(rank, world, gloo):
    """allgather_bucket_size, counted by the backend (communication_stats) over one stage-1
    step: each bucket's updated shard of S elements goes in max(1, S x world // size) all-gathers
    (DeepSpeed's rule), moving the same bytes in all, and training is bit for bit the default's
    (one all-gather per bucket). On this machine pin_memory pins nothing (no GPU) and changes
    nothing. Catches the key parsed and ignored."""
    from shardwise import _C

    def one_step(**zero):
        config = zero_config(1, world)
        config["zero_optimization"].update(zero)
        engine = shardwise.zero.initialize(make_model(), config)
        inputs, targets = local(global_batch(0, world), rank)
        engine.backward(loss_of(engine, inputs, targets))
        before = _C.communication_stats().get("all_gather", {})
        engine.step()
        after = _C.communication_stats().get("all_gather", {})
        calls = after.get("calls", 0) - before.get("calls", 0)
        moved = after.get("bytes", 0) - before.get("bytes", 0)
        return engine, calls, moved

    size = 700
    default, calls, moved = one_step()
    offload = {"device": "cpu", "pin_memory": True}
    chunked, chunked_calls, chunked_moved = one_step(
        allgather_bucket_size=size, offload_optimizer=offload
    )
    shards = default.optimizer.bucket_shard_numels()
    assert calls == len(shards), (calls, shards)
    assert chunked_calls == sum(max(1, s * world // size) for s in shards) > calls, chunked_calls
    assert chunked_moved == moved, (chunked_moved, moved)
    assert not chunked.optimizer.pinned()  # no GPU here: nothing to page-lock for
    ours, ref = chunked.module.state_dict(), default.module.state_dict()
    assert all(torch.equal(ours[n], t) for n, t in ref.items())


def zero_reduce_bucket_size_sets_the_gradient_reductions(rank, world, gloo):
    """reduce_bucket_size, counted by the backend over one stage-2 step: a tenth of the
    configured 3000 elements splits the gradients into more buckets, so more reduction calls
    move the same bytes, and training is bit for bit the same. Catches the key parsed and the
    buckets left at their default size."""
    from shardwise import _C

    def reductions() -> tuple[int, int]:
        stats = _C.communication_stats()
        ops = [v for k, v in stats.items() if k in ("reduce_scatter", "all_reduce", "reduce")]
        return sum(o.get("calls", 0) for o in ops), sum(o.get("bytes", 0) for o in ops)

    def one_step(size: int):
        config = zero_config(2, world)
        config["zero_optimization"]["reduce_bucket_size"] = size
        engine = shardwise.zero.initialize(make_model(), config)
        inputs, targets = local(global_batch(0, world), rank)
        calls, moved = reductions()
        engine.backward(loss_of(engine, inputs, targets))
        engine.step()
        after = reductions()
        return engine, after[0] - calls, after[1] - moved

    default, calls, moved = one_step(3000)
    small, small_calls, small_moved = one_step(300)
    assert small_calls > calls > 0 and small_moved == moved, (calls, small_calls, moved)
    ours, ref = small.module.state_dict(), default.module.state_dict()
    assert all(torch.equal(ours[n], t) for n, t in ref.items())


def zero_stage3_matches_single_process(rank, world, gloo):
    """Stage 3: the FSDP engine's shards stepped in place by the fused AdamW."""
    _parity(rank, world, 3)


def zero_accumulation_matches_one_big_batch(rank, world, gloo):
    """Accumulation: stage 1 reduces once at the boundary, stage 2 every micro-step into the
    partition; both must equal one step on the whole batch (loss scaled by 1/accumulation)."""
    for stage in (1, 2):
        _parity(rank, world, stage, accumulation=2)


def zero_clipping_sgd_and_offload_match_torch(rank, world, gloo):
    """Gradient clipping (the global norm summed from disjoint partitions, applied through the
    fused step's grad_scale), SGD with Nesterov momentum, and optimizer offload to CPU memory,
    each against single-process torch (clip_grad_norm_, torch.optim.SGD)."""
    for stage in (1, 2, 3):
        _parity(rank, world, stage, clip=0.05)
    _parity(rank, world, 2, sgd=True)
    _parity(rank, world, 2, offload=True)


def zero_prescale_and_predivide_match_single_process(rank, world, gloo):
    """DeepSpeed's prescale_gradients (divide by the world before reducing) and
    gradient_predivide_factor (divide by it before, by world / it after, folded into the fused
    step's scale), under SGD (AdamW would hide a wrong scale) and with clipping (the norm must
    see the averaged gradients): a factor applied twice or never drifts from the reference."""
    for stage in (0, 1, 2):
        _parity(rank, world, stage, sgd=True)  # DeepSpeed's default: all of it after
        _parity(rank, world, stage, sgd=True, prescale_gradients=True)
        _parity(rank, world, stage, sgd=True, gradient_predivide_factor=2.0 * world)
    _parity(rank, world, 2, clip=0.05, gradient_predivide_factor=0.5)


def zero_prescale_and_predivide_divide_before_the_fp16_reduction(rank, world, gloo):
    """prescale_gradients and gradient_predivide_factor seen in what is reduced: fp16 gradients
    of 40000 on every rank (static loss scale 1) sum to more than fp16 holds, so without
    either the reduced gradient overflows and the step is skipped on every rank; divided by the
    world (prescale) or by 2 x world (predivide) first, the sum fits and the step is taken.
    Catches either key parsed and the division left until after the reduction."""

    def stepped(stage: int, **keys) -> bool:
        model = torch.nn.Linear(1, 1, bias=False).half()
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "fp16": {"enabled": True, "loss_scale": 1.0},
            "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
            "zero_optimization": {"stage": stage},
            **keys,
        }
        engine = shardwise.zero.initialize(model, config)
        engine.backward(engine(torch.full((1, 1), 40000.0, dtype=torch.half)).float().sum())
        return engine.step()

    for stage in (1, 2):
        assert not stepped(stage), stage
        assert stepped(stage, prescale_gradients=True), stage
        assert stepped(stage, gradient_predivide_factor=2.0 * world), stage


def zero_overlap_comm_false_waits_for_each_reduction(rank, world, gloo):
    """overlap_comm from the config, seen in the engine: stage 2 with several buckets keeps
    two reductions in flight during backward by default (true) and one with overlap_comm
    false, with the same trained weights. Catches the key parsed and not passed on."""
    trained, in_flight = {}, {}
    for overlap in (True, False):
        config = zero_config(2, world)
        config["zero_optimization"].update(reduce_bucket_size=300, overlap_comm=overlap)
        engine = shardwise.zero.initialize(make_model(), config)
        train_zero(engine, rank, world, 2)
        trained[overlap] = engine.module.state_dict()
        in_flight[overlap] = engine.optimizer.max_in_flight()
    assert in_flight == {True: 2, False: 1}, in_flight
    assert all(torch.equal(trained[True][n], t) for n, t in trained[False].items())


def zero_stage3_prefetch_bucket_size_gathers_the_next_block_ahead(rank, world, gloo):
    """stage3_prefetch_bucket_size, counted by the backend when each block computes: above 0
    (DeepSpeed's default 5e7) stage 3 issues block 1's all-gather before block 0 computes (2
    gathers seen there, as FSDP's forward prefetch); 0 turns prefetch off (1 gather seen).
    Catches the key parsed and prefetch left on or off whatever it says."""
    from fsdp_effect_checks import BATCH, _Block, _step

    class Stack(torch.nn.Module):
        def __init__(self, log):
            super().__init__()
            self.blocks = torch.nn.ModuleList(_Block(str(i), log) for i in range(3))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    for size, seen_by_block0 in ((0, 1), (50_000_000, 2)):
        log: list = []
        torch.manual_seed(0)
        config = {
            "train_micro_batch_size_per_gpu": BATCH,
            "optimizer": {"type": "AdamW", "params": {"lr": LR}},
            "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": size},
        }
        engine = shardwise.zero.initialize(Stack(log), config)
        _step(engine.module, log)  # the first step records the forward order prefetch follows
        seen = _step(engine.module, log)
        assert seen[("0", "forward")] == seen_by_block0, (size, seen)


def zero1_matches_zero_redundancy_optimizer(rank, world, gloo):
    """Stage 1 against torch's ZeroRedundancyOptimizer (AdamW) under DDP, same data."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(make_model())
    opt = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=LR, weight_decay=WD
    )
    engine = shardwise.zero.initialize(make_model(), zero_config(1, world))
    ours = train_zero(engine, rank, world, STEPS)
    theirs = []
    for step in range(STEPS):
        loss = loss_of(model, *local(global_batch(step, world), rank))
        loss.backward()
        opt.step()
        opt.zero_grad()
        theirs.append(_global_mean(loss.detach()))
    assert_close_rel(ours, theirs, 1e-6, "losses vs ZeroRedundancyOptimizer")
    for name, tensor in model.module.state_dict().items():
        assert_close_rel(engine.module.state_dict()[name], tensor, 1e-6, name)


def zero_fp16_overflow_skips_everywhere(rank, world, gloo):
    """fp16: an inf gradient on rank 0 only must skip the step on every rank and halve the scale
    (hysteresis 1); a rank deciding alone would desynchronize the replicas."""
    fp16 = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1, "loss_scale_window": 100}
    engine = shardwise.zero.initialize(make_model(), zero_config(1, world, fp16=fp16))
    train_zero(engine, rank, world, 2)
    assert engine.loss_scale == 256.0, engine.loss_scale
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    loss = loss_of(engine, *local(global_batch(2, world), rank))
    engine.backward(loss)
    if rank == 0:
        next(engine.module.parameters()).grad.view(-1)[0] = float("inf")
    assert engine.step() is False, "the step with an overflow was not skipped"
    assert engine.loss_scale == 128.0, engine.loss_scale
    for name, tensor in engine.module.state_dict().items():
        assert torch.equal(tensor, before[name]), f"{name} changed in a skipped step"
    losses = train_zero(engine, rank, world, 2, first=3)
    assert all(torch.isfinite(torch.tensor(losses))), losses


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(256, 256) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def zero_memory_matches_the_formulas(rank, world, gloo):
    """Bytes per rank of parameters + gradients + optimizer state (from tensor storages, after
    backward) within 5% of the ZeRO paper's mixed-precision Adam formulas."""
    for stage, formula in (
        (1, lambda n: 2 + 2 + 12 / world),
        (2, lambda n: 2 + (2 + 12) / world),
        (3, lambda n: 16 / world),
    ):
        torch.manual_seed(0)
        model = Wide()
        phi = sum(p.numel() for p in model.parameters())
        config = zero_config(stage, world, bf16={"enabled": True})
        config["zero_optimization"]["reduce_bucket_size"] = 100_000
        engine = shardwise.zero.initialize(model, config)
        x = torch.randn(4, 256, dtype=torch.bfloat16)
        engine.backward(engine(x).float().square().mean())
        measured = sum(engine.memory_bytes().values())
        expected = formula(phi) * phi
        assert abs(measured - expected) <= 0.05 * expected, (
            f"stage {stage}: {measured} bytes per rank, formula {expected:.0f}"
        )
        engine.step()


def zero_checkpoint_loads_at_another_world_size(rank, world, gloo):
    """Optimizer state saved at world 2 loads at world 1 (each rank alone) and at world 4 (when
    4 ranks run) and the next steps equal the uninterrupted run: piece offsets and overlaps."""
    directory = Path(f"/tmp/shardwise-zero-ckpt-{os.environ['MASTER_PORT']}")
    pairs = [dist.new_group([2 * k, 2 * k + 1]) for k in range(world // 2)]
    singles = [dist.new_group([r]) for r in range(world)]
    pair = pairs[rank // 2]
    for stage in (1, 2, 3):
        saved = directory / f"stage{stage}"
        engine = shardwise.zero.initialize(make_model(), zero_config(stage, 2), pair)
        train_zero(engine, rank % 2, 2, 6)
        if rank < 2:
            engine.save_optimizer_checkpoint(saved)
        dist.barrier()
        expected = train_zero(engine, rank % 2, 2, 4, first=6)
        # world 1: this rank alone, the whole global batch of 2 ranks.
        alone = zero_config(stage, 1)
        alone["train_micro_batch_size_per_gpu"] = 2 * BATCH_PER_RANK
        engine1 = shardwise.zero.initialize(make_model(seed=5), alone, singles[rank])
        engine1.load_optimizer_checkpoint(saved)
        got = []
        for step in range(6, 10):
            loss = loss_of(engine1, *global_batch(step, 2))
            engine1.backward(loss)
            engine1.step()
            got.append(loss.item())
        assert_close_rel(got, expected, 1e-6, f"stage {stage} losses after loading at world 1")
        if world == 4:  # every rank: world 4 with the same global batch of 2 ranks' data
            four = zero_config(stage, 4)
            four["train_micro_batch_size_per_gpu"] = BATCH_PER_RANK // 2
            engine4 = shardwise.zero.initialize(make_model(seed=5), four)
            engine4.load_optimizer_checkpoint(saved)
            got4 = []
            for step in range(6, 10):
                inputs, targets = global_batch(step, 2)
                part = slice(rank * BATCH_PER_RANK // 2, (rank + 1) * BATCH_PER_RANK // 2)
                loss = loss_of(engine4, inputs[part], targets[part])
                engine4.backward(loss)
                engine4.step()
                got4.append(_global_mean(loss.detach()))
            assert_close_rel(got4, expected, 1e-6, f"stage {stage} losses after loading at 4")
        dist.barrier()


def zero_bad_configs_fail_before_any_collective(rank, world, gloo):
    """Unknown keys (with a suggestion), inconsistent batch sizes and bad values are rejected
    while building the config, before any process group traffic."""
    cases = [
        ({"zero_optimisation": {}}, "Did you mean 'zero_optimization'"),
        ({"zero_optimization": {"stage": 4}}, "stage must be 0, 1, 2 or 3"),
        (
            {
                "train_batch_size": 7,
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 1,
            },
            "train_batch_size 7 !=",
        ),
        ({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}}, "valid: none, cpu"),
        ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "enable one of them"),
    ]
    for config, message in cases:
        config.setdefault("train_micro_batch_size_per_gpu", 2)
        try:
            shardwise.zero.initialize(make_model(), config)
        except ValueError as e:
            assert message in str(e), f"{message!r} not in {e}"
        else:
            raise AssertionError(f"{config} was accepted")


CHECKS = [
    zero_stage0_matches_single_process,
    zero_stage1_matches_single_process,
    zero_stage2_matches_single_process,
    zero_stage3_matches_single_process,
    zero_accumulation_matches_one_big_batch,
    zero_clipping_sgd_and_offload_match_torch,
    zero_prescale_and_predivide_match_single_process,
    zero_prescale_and_predivide_divide_before_the_fp16_reduction,
    zero_lamb_matches_single_process_lamb,
    zero_allgather_bucket_size_sets_the_parameter_all_gathers,
    zero_reduce_bucket_size_sets_the_gradient_reductions,
    zero_overlap_comm_false_waits_for_each_reduction,
    zero_stage3_prefetch_bucket_size_gathers_the_next_block_ahead,
    zero1_matches_zero_redundancy_optimizer,
    zero_fp16_overflow_skips_everywhere,
    zero_memory_matches_the_formulas,
    zero_checkpoint_loads_at_another_world_size,
    zero_bad_configs_fail_before_any_collective,
]
