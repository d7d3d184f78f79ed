"""DeepSpeed's ZeRO++ keys at stage 3, run with zero_checks.py's world: hpZ
(zero_hpz_partition_size), qwZ (zero_quantized_weights) and qgZ (zero_quantized_gradients), each
against plain stage 3 in the same world."""

import shardwise.zero
import torch
import torch.distributed as dist
from fsdp_checks import assert_close_rel, global_batch, local, loss_of, make_model
from zero_checks import STEPS, train_zero, zero_config


def zero_hpz_partition_size_gathers_backward_within_its_group(rank, world, gloo):
    """ZeRO++'s hpZ (zero_hpz_partition_size) at stage 3: after forward each block keeps a
    secondary partition over groups of that many consecutive ranks, and backward all-gathers
    within them. At world 4 with size 2: backward advances the 2-rank group's sequence once per
    block, and the world's by as many fewer than without the key; training is bit-identical to
    plain stage 3 (an all-gather moves bits exactly). At world 2 the size is the whole world:
    plain stage 3, as in DeepSpeed. Catches the key parsed and backward still gathering over
    the whole group, the wrong blocks kept (changed results), or a group of other ranks."""
    from shardwise.fsdp.module import post_forward_group

    size = 2
    moved, results = {}, {}
    for hpz in (1, size):
        config = zero_config(3, world)
        config["zero_optimization"]["zero_hpz_partition_size"] = hpz
        engine = shardwise.zero.initialize(make_model(), config)
        effective = engine.config["zero_optimization"]["zero_hpz_partition_size"]
        assert effective == (hpz if hpz < world else 1), (hpz, effective)
        losses = train_zero(engine, rank, world, 2)  # the first backward checks the order
        blocks = len(engine.module.units()) - 1  # every unit but the root
        small = post_forward_group(list(range(world)), size) if effective > 1 else None
        inputs, targets = local(global_batch(2, world), rank)
        loss = loss_of(engine, inputs, targets)
        before = [g._get_sequence_number_for_group() for g in (dist.group.WORLD, small) if g]
        engine.backward(loss)
        after = [g._get_sequence_number_for_group() for g in (dist.group.WORLD, small) if g]
        engine.step()
        moved[hpz] = [b - a for a, b in zip(before, after, strict=True)]
        results[hpz] = (losses, engine.module.state_dict())
    if world > size:
        assert sorted(dist.get_process_group_ranks(small)) == [
            rank - rank % size + i for i in range(size)
        ]
        assert moved[size][1] == blocks, moved
        assert moved[1][0] - moved[size][0] == blocks, moved
    else:
        assert moved[size] == moved[1], moved
    assert results[size][0] == results[1][0], results
    for name, tensor in results[1][1].items():
        assert torch.equal(results[size][1][name], tensor), name


def _counted(kind: str) -> int:
    from shardwise import _C

    return _C.communication_stats().get(kind, {}).get("bytes", 0)


def zero_quantized_weights_gathers_int8_with_block_scales(rank, world, gloo):
    """ZeRO++'s zero_quantized_weights (qwZ) at stage 3: the parameters are all-gathered as int8
    with an fp32 scale per block of 2048, so a step's all-gathers move under 0.3x the bytes of
    fp32 ones (counted by the backend; the ideal is (1 + 4/2048) / 4). What forward computes with
    is, on every rank bit-identically, each master value to within half its unit's largest
    magnitude / 127, and not the master values themselves; the master weights are untouched by
    a gather; 20 steps' losses stay within 2% of plain stage 3's (int8 rounding moves each
    weight by at most 0.4% of its block's largest). Catches the key parsed and fp32 still sent,
    ranks dequantizing differently, and quantized values leaking into the master weights."""
    moved, losses = {}, {}
    for quantized in (False, True):
        config = zero_config(3, world)
        config["zero_optimization"]["zero_quantized_weights"] = quantized
        engine = shardwise.zero.initialize(make_model(), config)
        block = engine.module.module.layers[0]
        seen: list = []

        def record(module, _args, seen=seen):
            seen.append([p.detach().clone() for p in module.parameters()])

        block.register_forward_pre_hook(record)
        losses[quantized] = train_zero(engine, rank, world, STEPS)
        master = dict(engine.module.state_dict())
        inputs, targets = local(global_batch(STEPS, world), rank)
        seen.clear()
        start = _counted("all_gather")
        engine.backward(loss_of(engine, inputs, targets))
        moved[quantized] = _counted("all_gather") - start
        after = engine.module.state_dict()
        assert all(torch.equal(after[n], t) for n, t in master.items()), "a gather changed them"
        full = [master[f"layers.0.{n}"] for n, _ in block.named_parameters()]
        computed = seen[0]
        largest = max(t.abs().max().item() for t in full)
        error = max((c - t).abs().max().item() for c, t in zip(computed, full, strict=True))
        if quantized:
            assert 0 < error <= largest / 254 + largest * 1e-6, (error, largest)
            flat = torch.cat([c.reshape(-1) for c in computed])
            everyone = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(everyone, flat)
            assert all(torch.equal(flat, other) for other in everyone), "ranks differ"
        else:
            assert error == 0, error
    assert moved[True] < 0.3 * moved[False], moved
    assert_close_rel(losses[True], losses[False], 0.02, "losses with qwZ vs without")


def zero_quantized_gradients_reduce_scatter_int8_blocks(rank, world, gloo):
    """ZeRO++'s zero_quantized_gradients (qgZ) at stage 3: each chunk of a unit's gradient goes
    to its owner as int8 blocks over an all-to-all and is summed there in fp32. A backward then
    runs no reduce-scatter, and the rows it exchanges take under 0.3x the bytes of the fp32 rows
    the plain reduce-scatter reduces (the backend counts outputs: W rows received against one
    fp32 row of W); the gradient shards after one backward are within 2% (relative norm) of plain
    stage 3's, and 20 steps' losses within 2%. Catches the key parsed and fp32 still reduced,
    rows sent to the wrong owner (gradients far off), and a lost pre/post division."""
    exchanged, grads, losses = {}, {}, {}
    for quantized in (False, True):
        config = zero_config(3, world)
        config["zero_optimization"]["zero_quantized_gradients"] = quantized
        torch.manual_seed(0)
        engine = shardwise.zero.initialize(make_model(), config)
        inputs, targets = local(global_batch(0, world), rank)
        before = {k: _counted(k) for k in ("reduce_scatter", "all_to_all")}
        engine.backward(loss_of(engine, inputs, targets))
        moved = {k: _counted(k) - before[k] for k in before}
        grads[quantized] = torch.cat([p.grad.reshape(-1) for p in engine.module.parameters()])
        engine.step()
        if quantized:
            assert moved["reduce_scatter"] == 0, moved
            exchanged[True] = moved["all_to_all"]
        else:
            assert moved["all_to_all"] == 0, moved
            exchanged[False] = moved["reduce_scatter"] * world
        losses[quantized] = train_zero(engine, rank, world, STEPS, first=1)
    assert 0 < exchanged[True] < 0.3 * exchanged[False], exchanged
    assert_close_rel(grads[True], grads[False], 0.02, "gradient shards with qgZ vs without")
    assert_close_rel(losses[True], losses[False], 0.02, "losses with qgZ vs without")


CHECKS = [
    zero_hpz_partition_size_gathers_backward_within_its_group,
    zero_quantized_weights_gathers_int8_with_block_scales,
    zero_quantized_gradients_reduce_scatter_int8_blocks,
]
