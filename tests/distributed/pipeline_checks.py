"""Pipeline checks run inside a world of worker processes (see worker.py): every schedule, for
several microbatch counts (m < p included), against the unpipelined model in one process: the
loss and every gradient of this rank's stages."""

import os
import time

import shardwise.pipeline as pp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DIM = 16


def make_blocks(count, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(count))


def _rel(ours, ref):
    return ((ours.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _parity(rank, world, kind, m, v=1, defer=False):
    stages = world * v
    blocks = make_blocks(stages)
    if defer:
        pp.defer_weight_gradients(blocks)
    reference = make_blocks(stages)
    g = torch.Generator().manual_seed(100 + m)
    x = torch.randn(2 * m, DIM, generator=g)
    y = torch.randn(2 * m, DIM, generator=g)
    ref_loss = F.mse_loss(nn.Sequential(*reference)(x), y)
    ref_loss.backward()
    schedule = pp.make_schedule(kind, world, m, v)
    mine = {s: blocks[s] for s in range(stages) if s % world == rank}
    pipe = pp.Pipeline(mine, schedule, F.mse_loss)
    loss = pipe.step(x, y)
    what = f"{kind} p={world} m={m} v={v}"
    if (stages - 1) % world == rank:
        assert abs(loss - ref_loss.item()) <= 1e-6 * abs(ref_loss.item()), (
            f"{what}: loss {loss} vs {ref_loss.item()}"
        )
    for s in mine:
        for (name, p), q in zip(
            blocks[s].named_parameters(), reference[s].parameters(), strict=True
        ):
            err = _rel(p.grad, q.grad)
            assert err <= 1e-6, f"{what}: stage {s} {name} gradient relative error {err:.2e}"
    return pipe.last


def _microbatch_counts(p):
    return sorted({1, p - 1, p, 2 * p + 1} - {0})


def pipeline_gpipe_matches_unpipelined(rank, world, gloo):
    """GPipe: activations and gradients routed to the right stage and microbatch, loss scaled
    once by 1/m, gradients accumulated over microbatches."""
    for m in _microbatch_counts(world):
        _parity(rank, world, "gpipe", m)


def pipeline_1f1b_matches_unpipelined(rank, world, gloo):
    """1F1B: the interleaving of forwards and backwards (a stash popped out of order, or a
    gradient sent to the wrong microbatch, shows as a gradient error); m < p degenerates."""
    for m in _microbatch_counts(world):
        last = _parity(rank, world, "1f1b", m)
        assert last["peak_stashed"] == min(m, world - rank), last["peak_stashed"]


def pipeline_interleaved_matches_unpipelined(rank, world, gloo):
    """Interleaved 1F1B with 2 stages per rank: channel order between ranks that exchange both
    activations and gradients, and local stage-to-stage hand-offs."""
    for m in _microbatch_counts(world):
        _parity(rank, world, "interleaved_1f1b", m, v=2)


def pipeline_zero_bubble_matches_unpipelined(rank, world, gloo):
    """ZB-H1 with deferred weight gradients: a W that runs another microbatch's queued work, or
    never runs it (a lost or doubled weight gradient), or an I whose deferred work leaks into
    the next I, shows as a gradient error; the stash is held until W, never beyond p."""
    for m in _microbatch_counts(world):
        last = _parity(rank, world, "zb_h1", m, defer=True)
        assert last["peak_stashed"] <= min(m, world), last["peak_stashed"]
        times = last["times"]
        assert len(times) == len(pp.make_schedule("zb_h1", world, m).actions(rank))


def pipeline_variable_shapes_across_steps(rank, world, gloo):
    """The header before every message: a second step with another batch size and sequence
    shape must still line up (a cached shape would mis-receive)."""
    blocks = make_blocks(world)
    mine = {rank: blocks[rank]}
    pipe = pp.Pipeline(mine, pp.make_schedule("1f1b", world, 2), F.mse_loss)
    for rows in (4, 6):
        x = torch.randn(rows, 3, DIM)
        y = torch.randn(rows, 3, DIM)
        pipe.step(x, y)
        for p in blocks[rank].parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all()
            p.grad = None


def pipeline_bad_arguments_are_named(rank, world, gloo):
    """Stages that do not match the schedule, and batches that cannot be cut into m pieces."""
    blocks = make_blocks(world)
    schedule = pp.make_schedule("1f1b", world, 3)
    try:
        pp.Pipeline({(rank + 1) % world: blocks[0]}, schedule, F.mse_loss)
    except ValueError as e:
        assert f"rank {rank} must hold stages" in str(e), str(e)
    else:
        raise AssertionError("wrong stages accepted")
    try:
        pp.make_schedule("zigzag", world, 3)
    except ValueError as e:
        assert "valid: gpipe, 1f1b, interleaved_1f1b, zb_h1" in str(e), str(e)
    else:
        raise AssertionError("unknown schedule accepted")


CHECKS = [
    pipeline_gpipe_matches_unpipelined,
    pipeline_1f1b_matches_unpipelined,
    pipeline_interleaved_matches_unpipelined,
    pipeline_zero_bubble_matches_unpipelined,
    pipeline_variable_shapes_across_steps,
    pipeline_bad_arguments_are_named,
]


def fault_pipeline_stage_dies(rank, world, gloo):
    """A stage process that dies mid-step: the others must raise (naming the dead rank), not
    hang in a receive."""
    blocks = make_blocks(world)

    def dying(x):
        os._exit(0)

    stage = dying if rank == world - 1 else blocks[rank]
    pipe = pp.Pipeline({rank: stage}, pp.make_schedule("1f1b", world, 4), F.mse_loss)
    dist.barrier()
    start = time.monotonic()
    try:
        pipe.step(torch.randn(8, DIM), torch.randn(8, DIM))
    except RuntimeError as e:
        assert f"rank {world - 1}" in str(e), str(e)
    else:
        raise AssertionError("no error")
    assert time.monotonic() - start < 15, time.monotonic() - start


def _mesh_training(rank, world, kind):
    """4 ranks as [[2, 2], [kind, "pp"]] (pp outermost): 3 AdamW steps against one process on
    the whole batch."""
    from shardwise.mesh import Mesh

    mesh = Mesh([[2, 2], [kind, "pp"]])
    blocks, reference = make_blocks(2), make_blocks(2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    s, data_rank = mesh.coordinate("pp"), mesh.coordinate(kind)
    stage = blocks[s]
    if kind == "fsdp":
        import shardwise

        stage = shardwise.FullyShardedDataParallel(stage, process_group=mesh.group(kind))
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-2)
    pipe = pp.Pipeline(
        {s: stage},
        pp.make_schedule("1f1b", 2, 3),
        F.mse_loss,
        group=mesh.group("pp"),
        rank=s,
        data_parallel_group=mesh.group(kind),
    )
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(12, DIM, generator=g), torch.randn(12, DIM, generator=g)
        half = slice(data_rank * 6, (data_rank + 1) * 6)
        pipe.step(x[half], y[half])
        opt.step()
        opt.zero_grad()
        F.mse_loss(nn.Sequential(*reference)(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    ours = stage.state_dict() if kind == "fsdp" else blocks[s].state_dict()
    for name, tensor in reference[s].state_dict().items():
        err = _rel(ours[name], tensor)
        assert err <= 1e-5, f"{kind} x pp: stage {s} {name} relative error {err:.2e}"


def pipeline_dp_x_pp_matches_single_process(rank, world, gloo):
    """dp × pp: replicated stages averaged over the data axis once per step (a missing or double
    average, or the wrong group, changes the parameters)."""
    if world == 4:
        _mesh_training(rank, world, "dp")


def pipeline_fsdp_x_pp_matches_single_process(rank, world, gloo):
    """fsdp × pp: each stage FSDP-sharded over the data axis, reducing only in its last backward
    of the step (reducing every microbatch would still be right but slow; never reducing
    would leave the shards' gradients empty)."""
    if world == 4:
        _mesh_training(rank, world, "fsdp")


def pipeline_mesh_errors_name_the_fix(rank, world, gloo):
    """A mesh whose product is not the world size, or with an unknown axis, is rejected before
    any group is made."""
    from shardwise.mesh import Mesh

    for mesh, message in (
        ([[3, 2], ["dp", "pp"]], "make the product of the sizes equal the world size"),
        ([[1, world], ["xp", "pp"]], "valid: pp, dp, fsdp, tp"),
    ):
        try:
            Mesh(mesh)
        except ValueError as e:
            assert message in str(e), str(e)
        else:
            raise AssertionError(f"{mesh} accepted")


CHECKS += [
    pipeline_dp_x_pp_matches_single_process,
    pipeline_fsdp_x_pp_matches_single_process,
    pipeline_mesh_errors_name_the_fix,
]


class _Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, DIM)

    def forward(self, tokens):
        return self.embed(tokens)


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(DIM, 32, bias=False)

    def forward(self, x):
        return self.head(torch.tanh(x))


def pipeline_tied_embedding_stays_tied(rank, world, gloo):
    """An embedding on the first stage tied to the head on the last: the copies start equal and
    each gets the sum of both gradients (either alone would train a different model)."""
    torch.manual_seed(3)
    embed, head, middle = _Embed(), _Head(), make_blocks(world - 2) if world > 2 else []
    head.head.weight = nn.Parameter(torch.randn(32, DIM))  # different until tied
    ref_embed, ref_head = _Embed(), _Head()
    ref_embed.load_state_dict(embed.state_dict())
    ref_head.head.weight = ref_embed.embed.weight  # the unpipelined model shares one tensor
    ref_mid = make_blocks(world - 2) if world > 2 else []
    tokens = torch.randint(0, 32, (6, 5), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 32, (6, 5), generator=torch.Generator().manual_seed(1))

    def loss_fn(logits, t):
        return F.cross_entropy(logits.reshape(-1, 32), t.reshape(-1))

    x = ref_embed(tokens)
    for block in ref_mid:
        x = block(x)
    loss_fn(ref_head(x), targets).backward()
    modules = [embed, *middle, head]
    pipe = pp.Pipeline(
        {rank: modules[rank]},
        pp.make_schedule("1f1b", world, 3),
        loss_fn,
        tied=[(0, "embed.weight", world - 1, "head.weight")],
    )
    pipe.step(tokens, targets)
    if rank == 0:
        err = _rel(embed.embed.weight.grad, ref_embed.embed.weight.grad)
        assert err <= 1e-6, f"embedding gradient relative error {err:.2e}"
    if rank == world - 1:
        assert torch.equal(head.head.weight.data, ref_embed.embed.weight.data), "not tied at start"
        err = _rel(head.head.weight.grad, ref_embed.embed.weight.grad)
        assert err <= 1e-6, f"head gradient relative error {err:.2e}"


CHECKS.append(pipeline_tied_embedding_stays_tied)


def pipeline_gpt_split_with_tied_head_matches_unpipelined(rank, world, gloo):
    """The bundled GPT cut by parameter count into `world` stages (embedding first, norm + head
    last, the head's weight tied to the embedding across the two stages): loss and gradients
    equal the unpipelined GPT's (a wrong cut, a lost tie or a mis-summed tied gradient shows)."""
    import copy

    from shardwise.models import GPT, PRESETS

    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    reference = copy.deepcopy(model)
    blocks, tied = pp.gpt_blocks(model)
    groups = pp.split_by_parameters(blocks, world)
    stages = pp.stage_modules(blocks, groups)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, PRESETS["tiny"].vocab_size, (4, 17), generator=g)

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    pipe = pp.Pipeline(
        {rank: stages[rank]},
        pp.make_schedule("1f1b", world, 2),
        loss_fn,
        tied=[(0, f"0.{tied[0]}", world - 1, f"{len(groups[-1]) - 1}.{tied[1]}")],
    )
    loss = pipe.step(tokens[:, :-1], tokens[:, 1:])
    ref_loss = reference.loss(tokens[:, :-1], tokens[:, 1:])
    ref_loss.backward()
    if rank == world - 1:
        assert abs(loss - ref_loss.item()) <= 1e-6 * ref_loss.item(), (loss, ref_loss.item())
    ref_blocks, _ = pp.gpt_blocks(reference)
    for i in groups[rank]:
        for (name, p), (_, q) in zip(
            blocks[i].named_parameters(), ref_blocks[i].named_parameters(), strict=True
        ):
            # The unpipelined GPT has one tied tensor: both copies must carry its gradient.
            expected = reference.embed.weight.grad if name in tied else q.grad
            err = _rel(p.grad, expected)
            assert err <= 1e-6, f"block {i} {name}: gradient relative error {err:.2e}"


CHECKS.append(pipeline_gpt_split_with_tied_head_matches_unpipelined)


def pipeline_evaluate_matches_unpipelined_and_leaves_gradients(rank, world, gloo):
    """Pipeline.evaluate (the schedule's forwards only, under no-grad): the loss equals the
    unpipelined model's for every schedule (interleaved too), no gradient appears, and a training
    step after it is the step it would have been (an evaluation that left activations stashed,
    a received tensor unconsumed, or grad mode off, would change or hang the next step)."""
    for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1)):
        stages = world * v
        blocks, reference = make_blocks(stages), make_blocks(stages)
        if kind == "zb_h1":
            pp.defer_weight_gradients(blocks)
        m = world + 1
        g = torch.Generator().manual_seed(7)
        x, y = torch.randn(2 * m, DIM, generator=g), torch.randn(2 * m, DIM, generator=g)
        with torch.no_grad():
            ref = F.mse_loss(nn.Sequential(*reference)(x), y).item()
        mine = {s: blocks[s] for s in range(stages) if s % world == rank}
        pipe = pp.Pipeline(mine, pp.make_schedule(kind, world, m, v), F.mse_loss)
        has_first, has_last = rank == 0, (stages - 1) % world == rank
        loss = pipe.evaluate(x if has_first else None, y if has_last else None)
        if has_last:
            assert abs(loss - ref) <= 1e-6 * ref, f"{kind}: eval loss {loss} vs {ref}"
        else:
            assert loss == 0.0, f"{kind}: a rank without the last stage reported {loss}"
        assert all(p.grad is None for b in mine.values() for p in b.parameters()), kind
        assert torch.is_grad_enabled(), f"{kind}: evaluate left grad mode off"
        train = pipe.step(x, y)
        F.mse_loss(nn.Sequential(*reference)(x), y).backward()
        if has_last:
            assert abs(train - ref) <= 1e-6 * ref, f"{kind}: the step after evaluate: {train}"
        for s in mine:
            for p, q in zip(blocks[s].parameters(), reference[s].parameters(), strict=True):
                assert _rel(p.grad, q.grad) <= 1e-6, f"{kind}: stage {s} gradient after evaluate"


CHECKS.append(pipeline_evaluate_matches_unpipelined_and_leaves_gradients)
