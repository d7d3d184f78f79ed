"""The fused sharding copies against the torch reference they replace (pad + chunk + cat +
``.to()`` for the copy-ins, ``view`` + slicing for the copy-outs), bit for bit: no reduction
happens in a copy, so every comparison is exact. Plus ``torch.library.opcheck`` on every op."""

import pytest
import shardwise  # noqa: F401
import torch
import torch.nn.functional as F
from conftest import requires_cuda
from shardwise.ops import sharding as ops

# The last group spans several of the CUDA executor's 8192-element tiles per run, with runs that
# end mid-tile, an empty run between them, and (at worlds 3 and 4) pieces off a 16-byte boundary.
GROUPS = [[1], [7, 1, 33], [64, 128, 5, 1000, 3], [0, 17], [4096], [40001, 1, 0, 24579, 16384]]
WORLDS = [1, 2, 3, 4]
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def params_of(numels, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtype).to(device) for n in numels]


def piece(flat, world, rank):
    """Reference: rank's padded piece of one flat tensor."""
    c = ops.chunk(flat.numel(), world)
    return F.pad(flat, (0, c * world - flat.numel()))[rank * c : (rank + 1) * c]


def reference_shard(params, world, rank, dtype):
    return torch.cat([piece(p, world, rank) for p in params]).to(dtype)


def assert_bits(ours, ref):
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert torch.equal(ours.view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("numels", GROUPS)
def test_all_gather_copy_in_and_out(numels, world, dtype, device):
    params = params_of(numels, device=device)
    shards = []
    for rank in range(world):
        mine = [piece(p, world, rank)[: ops.valid(p.numel(), world, rank)] for p in params]
        shard = ops.all_gather_copy_in(mine, numels, world, rank, dtype)
        assert_bits(shard, reference_shard(params, world, rank, dtype))
        shards.append(shard)
    full = ops.all_gather_copy_out(torch.cat(shards), numels, world)
    into = [torch.full((n,), 9.0, dtype=dtype, device=device) for n in numels]
    ops.all_gather_copy_out_(torch.cat(shards), numels, world, into)
    for p, f, i in zip(params, full, into, strict=True):
        assert_bits(f, p.to(dtype))
        assert_bits(i, p.to(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "grad_dtype,reduce_dtype,scale",
    [
        (torch.float32, torch.float32, 1.0),
        (torch.float32, torch.float32, 0.25),
        (torch.bfloat16, torch.float32, 1.0),
        (torch.float32, torch.bfloat16, 0.5),
        (torch.float16, torch.float16, 1 / 3),
    ],
)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("numels", GROUPS)
def test_reduce_scatter_copy_in_and_out(numels, world, grad_dtype, reduce_dtype, scale, device):
    grads = params_of(numels, grad_dtype, seed=1, device=device)
    grads_or_none = [None if i == 1 else g for i, g in enumerate(grads)]
    buffer = ops.reduce_scatter_copy_in(grads_or_none, numels, world, reduce_dtype, scale)
    compute = torch.float32
    expected = torch.cat(
        [
            (piece(g if gn is not None else torch.zeros_like(g), world, r).to(compute) * scale).to(
                reduce_dtype
            )
            for r in range(world)
            for g, gn in zip(grads, grads_or_none, strict=True)
        ]
    )
    assert_bits(buffer, expected)
    reused = torch.full_like(buffer, float("nan"))  # every element, padding too, is written
    ops.reduce_scatter_copy_in_(grads_or_none, numels, world, scale, reused)
    assert_bits(reused, expected)
    block = buffer.numel() // world
    for rank in range(world):
        reduced = buffer[rank * block : (rank + 1) * block]
        fresh = ops.reduce_scatter_copy_out(reduced, numels, world, rank, torch.float32, 2.0)
        accumulated = [torch.full_like(f, 0.5) for f in fresh]
        ops.reduce_scatter_copy_out_(reduced, numels, world, rank, 2.0, accumulated)
        overwritten = [torch.full_like(f, float("nan")) for f in fresh]
        ops.reduce_scatter_copy_out_(reduced, numels, world, rank, 2.0, overwritten, False)
        offset = 0
        for n, f, a, w in zip(numels, fresh, accumulated, overwritten, strict=True):
            v = ops.valid(n, world, rank)
            ref = reduced[offset : offset + v].to(torch.float32) * 2.0
            assert_bits(f, ref)
            assert_bits(a, 0.5 + ref)
            assert_bits(w, ref)
            offset += ops.chunk(n, world)


def test_bad_arguments_name_the_argument_and_the_fix():
    params = params_of([10, 20])
    with pytest.raises(ValueError, match=r"shards\[1\] has 5 elements, expected 16"):
        ops.all_gather_copy_in([params[0], params[1][:5]], [10, 20], 2, 0, torch.float32)
    with pytest.raises(ValueError, match=r"rank 2 is outside \[0, 2\)"):
        ops.all_gather_copy_in(params, [10, 20], 2, 2, torch.float32)
    with pytest.raises(ValueError, match="1 shards for 2 entries of numels"):
        ops.all_gather_copy_in(params[:1], [10, 20], 2, 0, torch.float32)
    with pytest.raises(TypeError, match="must be float32, float64, bfloat16 or float16"):
        ops.reduce_scatter_copy_in([torch.ones(10, dtype=torch.int32)], [10], 2, torch.float32)
    with pytest.raises(ValueError, match="every gradient is None"):
        ops.reduce_scatter_copy_in([None], [10], 2, torch.float32)
    with pytest.raises(ValueError, match="buffer has 31 elements, expected 32"):
        ops.reduce_scatter_copy_in_([params[0]], [10], 2, 1.0, torch.empty(31))
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        ops.all_gather_copy_out(torch.ones(32), [10], 0)


def test_opcheck_every_sharding_op():
    numels, world, rank = [7, 1, 33], 3, 1
    params = params_of(numels)
    mine = [piece(p, world, rank)[: ops.valid(p.numel(), world, rank)] for p in params]
    shard = ops.all_gather_copy_in(mine, numels, world, rank, torch.bfloat16)
    gathered = torch.randn(shard.numel() * world)
    reduced = torch.randn(shard.numel())
    grads = [torch.zeros(ops.valid(n, world, rank)) for n in numels]
    cases = [
        (
            torch.ops.shardwise.all_gather_copy_in.default,
            (mine, numels, world, rank, torch.bfloat16),
        ),
        (torch.ops.shardwise.all_gather_copy_out.default, (gathered, numels, world)),
        (
            torch.ops.shardwise.all_gather_copy_out_.default,
            (gathered, numels, world, [torch.empty(n) for n in numels]),
        ),
        (
            torch.ops.shardwise.reduce_scatter_copy_in.default,
            ([params[0], None, params[2]], numels, world, torch.float32, 0.5),
        ),
        (
            torch.ops.shardwise.reduce_scatter_copy_in_.default,
            ([params[0], None, params[2]], numels, world, 0.5, torch.empty(shard.numel() * world)),
        ),
        (
            torch.ops.shardwise.reduce_scatter_copy_out.default,
            (reduced, numels, world, rank, torch.float32, 2.0),
        ),
        (
            torch.ops.shardwise.reduce_scatter_copy_out_.default,
            (reduced, numels, world, rank, 2.0, grads),
        ),
        (
            torch.ops.shardwise.reduce_scatter_copy_out_.default,
            (reduced, numels, world, rank, 2.0, [torch.empty_like(g) for g in grads], False),
        ),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
