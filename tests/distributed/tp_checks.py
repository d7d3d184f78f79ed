"""Tensor-parallel checks run inside a world of worker processes (see worker.py): the
vocabulary-parallel loss against F.cross_entropy, the GPT's loss and every gradient at tp = world
(with and without sequence parallelism, over the shardwise backend and over gloo) against one
process, 2 x 2 meshes (fsdp x tp, dp x tp) against single-process AdamW, the mesh's groups, and
bad input refused before anything changes."""

import shardwise
import shardwise.tensor_parallel as tp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from shardwise.mesh import Mesh
from shardwise.models.gpt import GPT, GPTConfig
from torch import nn

CFG = GPTConfig(vocab_size=256, seq_len=16, dim=64, layers=2, heads=4)


def _rel(ours, ref):
    ours, ref = ours.detach().double(), ref.detach().double()
    return ((ours - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _gpt(seed=0, cfg=CFG):
    torch.manual_seed(seed)
    return GPT(cfg)


def _batch(seed, rows, cfg=CFG):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (rows, cfg.seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _full_grads(model, group):
    """Every gradient of a tensor-parallel model, shards gathered, by parameter name."""
    return {
        name: tp.full_tensor(p.grad, tp.tp_info(p), group) for name, p in model.named_parameters()
    }


def _hf_model(kind, seed=0):
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = {
        "gpt2": dict(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=256,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
        "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, vocab_size=256,
                      max_position_embeddings=32),
        "qwen2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, vocab_size=256,
                      max_position_embeddings=32),
    }[kind]  # fmt: skip
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **sizes))


def tp_hugging_face_models_match_single_process(rank, world, gloo):
    """Catches, for transformers' GPT-2, Llama and Qwen2 under ``hf_plan``: GPT-2's Conv1D
    weights cut on the wrong dimension or its fused QKV split by the full width (split_size not
    made local), k/v cut by the query heads (grouped heads), q/k/v biases not split with their
    heads, the tied GPT-2 head cut twice, the loss not the vocabulary-parallel one. Loss and
    every gathered gradient against the unsplit model (fp32, 1e-5)."""
    tokens, targets = _batch(5, 3)
    for kind in ("gpt2", "llama", "qwen2"):
        ref = _hf_model(kind)
        logits = ref(input_ids=tokens).logits
        ref_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        ref_loss.backward()
        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
        model = _hf_model(kind)
        tp.parallelize(model, dist.group.WORLD, tp.hf_plan(model.config))
        loss = model.cross_entropy(model(input_ids=tokens).logits, targets)
        loss.backward()
        assert _rel(loss, ref_loss) <= 1e-6, f"{kind}: loss {loss.item()} vs {ref_loss.item()}"
        grads = _full_grads(model, dist.group.WORLD)
        assert set(grads) == set(ref_grads), f"{kind}: {sorted(set(grads) ^ set(ref_grads))}"
        for name, grad in grads.items():
            err = _rel(grad, ref_grads[name])
            assert err <= 1e-5, f"{kind}: {name} gradient relative error {err:.2e}"
        shards = sum(p.numel() for p in model.parameters())
        full = sum(p.numel() for p in ref.parameters())
        assert shards < full * (0.6 if world == 2 else 0.4), f"{kind}: {shards} of {full}"


def tp_hugging_face_plans_refuse_what_they_cannot_cut(rank, world, gloo):
    """Catches a head count the tp size does not divide reaching the cut (GPT-2's attention
    would split its QKV output mid-head) and a model type without a plan accepted silently."""
    model = _hf_model("gpt2")
    plan = tp.hf_plan(model.config)
    plan["transformer.h.*.attn"] = tp.LocalCounts(("split_size", "no_such_count"))
    before = [p.detach().clone() for p in model.parameters()]
    _expect(lambda: tp.parallelize(model, dist.group.WORLD, plan), ["no_such_count"])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    from transformers import AutoConfig

    _expect(lambda: tp.hf_plan(AutoConfig.for_model("gpt_neo")), ["gpt_neo", "gpt2, llama"])


def tp_cross_entropy_matches_torch(rank, world, gloo):
    """Catches: a wrong max/target-logit/sum-exp reduction, a target on another rank's vocabulary
    slice, ignore_index counted in the mean, a wrong backward scale for mean/sum/none."""
    vocab = 12 * world
    g = torch.Generator().manual_seed(7)
    full = (torch.randn(3, 5, vocab, generator=g) * 4).requires_grad_()
    targets = torch.randint(0, vocab, (3, 5), generator=g)
    targets[0, 1] = targets[2, 4] = -100
    weights = torch.randn(3, 5, generator=g)
    for reduction in ("mean", "sum", "none"):
        for group in (None, gloo):
            full.grad = None
            ref = F.cross_entropy(full.reshape(-1, vocab), targets.reshape(-1), reduction=reduction)
            (ref * weights.reshape(-1) if reduction == "none" else ref).sum().backward()
            mine = full.detach().chunk(world, -1)[rank].clone().requires_grad_()
            loss = tp.cross_entropy(mine, targets, group=group, reduction=reduction)
            assert _rel(loss.reshape(-1), ref) <= 1e-6, f"{reduction}: {loss} vs {ref}"
            (loss * weights if reduction == "none" else loss).sum().backward()
            err = _rel(mine.grad, full.grad.chunk(world, -1)[rank])
            assert err <= 1e-6, f"{reduction}: gradient relative error {err:.2e}"
    all_ignored = torch.full((2, 3), -100)
    loss = tp.cross_entropy(torch.randn(2, 3, 12), all_ignored)
    ref = F.cross_entropy(torch.randn(6, 12 * world), all_ignored.reshape(-1))
    assert torch.isnan(loss) and torch.isnan(ref), "every token ignored: nan, as torch"


def _gpt_parity(rank, world, group, sequence_parallel, save_gathered=False):
    ref = _gpt()
    tokens, targets = _batch(3, 3)
    ref_loss = ref.loss(tokens, targets)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    plan = tp.gpt_plan(_gpt(), sequence_parallel, save_gathered=save_gathered)
    model = tp.parallelize(_gpt(), group, plan)
    loss = model.loss(tokens, targets)
    loss.backward()
    what = f"tp={world} sp={sequence_parallel} save_gathered={save_gathered}"
    assert _rel(loss, ref_loss) <= 1e-6, f"{what}: loss {loss.item()} vs {ref_loss.item()}"
    grads = _full_grads(model, group)
    assert set(grads) == set(ref_grads), f"{what}: {sorted(set(grads) ^ set(ref_grads))}"
    for name, grad in grads.items():
        assert grad.shape == ref_grads[name].shape, f"{what}: {name} {grad.shape}"
        err = _rel(grad, ref_grads[name])
        assert err <= 1e-6, f"{what}: {name} gradient relative error {err:.2e}"
    shards = sum(p.numel() for p in model.parameters())
    full = sum(p.numel() for p in ref.parameters())
    assert shards < full * (0.5 if world == 2 else 0.3) + 20_000, f"{what}: {shards} of {full}"


def tp_gpt_matches_single_process(rank, world, gloo):
    """Catches: a wrong QKV head split, a bias added before the reduction or twice, a missing
    input-gradient all-reduce, a tied embedding/head cut twice, a wrong vocabulary offset."""
    _gpt_parity(rank, world, dist.group.WORLD, sequence_parallel=False)


def tp_gpt_sequence_parallel_matches_single_process(rank, world, gloo):
    """Catches: a sequence gather/scatter on the wrong dim or in the wrong rank order, norm or
    row-bias gradients not summed over the group, positions not cut to the rank's tokens, a
    saved gathered input (save_gathered) that is not the whole sequence."""
    _gpt_parity(rank, world, dist.group.WORLD, sequence_parallel=True)
    _gpt_parity(rank, world, dist.group.WORLD, sequence_parallel=True, save_gathered=True)


def tp_gpt_over_gloo_matches_single_process(rank, world, gloo):
    """Catches: the layers depending on the shardwise backend (they take any c10d group)."""
    _gpt_parity(rank, world, gloo, sequence_parallel=True)
    _gpt_parity(rank, world, gloo, sequence_parallel=False)


def tp_bf16_autocast_within_torch_error(rank, world, gloo):
    """Catches: the C++ layers computing in the wrong dtype under autocast (their error against
    fp32 must stay within 2x torch's own bf16 error)."""
    tokens, targets = _batch(5, 2)
    ref32 = _gpt()
    ref32.loss(tokens, targets).backward()
    ref16 = _gpt()
    with torch.autocast("cpu", torch.bfloat16):
        ref16.loss(tokens, targets).backward()
    model = tp.parallelize(_gpt(), dist.group.WORLD, tp.gpt_plan(_gpt(), True))
    with torch.autocast("cpu", torch.bfloat16):
        model.loss(tokens, targets).backward()
    grads = _full_grads(model, dist.group.WORLD)
    for name, p in ref32.named_parameters():
        torch_err = _rel(dict(ref16.named_parameters())[name].grad, p.grad)
        ours = _rel(grads[name], p.grad)
        assert ours <= 2 * torch_err + 1e-3, f"{name}: {ours:.2e} vs torch's {torch_err:.2e}"


# AdamW's eps for the mesh parity runs. With the default 1e-8, an element whose gradient is
# rounding noise (~1e-9) still moves by a full +-lr, its sign set by the noise: any change of
# summation order (TP's split matmuls, another CPU's kernels) then moves such elements by 2 lr,
# and the parameters' error says which order the fp64 run happened to share (on an AVX-512 CPU,
# fp32 torch's error was 1.5e-6 and every other order's, torch's own avx2 kernels included,
# 1e-5 to 4e-5). 1e-5 keeps updates of real gradients as they were and noise as noise.
ADAM_EPS = 1e-5


def _train_mesh(rank, world, kind):
    """3 AdamW steps of the GPT on a 2 x 2 mesh [[2, 2], [kind, "tp"]]; returns the losses and
    the full parameters."""
    mesh = Mesh([[2, 2], [kind, "tp"]])
    tp_group, data_group = mesh.group("tp"), mesh.group(kind)
    model = tp.parallelize(_gpt(), tp_group, tp.gpt_plan(_gpt(), sequence_parallel=True))
    infos = {n: tp.tp_info(p) for n, p in model.named_parameters(remove_duplicate=False)}
    loss_fn = model.cross_entropy
    if kind == "fsdp":
        wrapped = shardwise.FullyShardedDataParallel(
            model, process_group=data_group, wrap=[f"blocks.{i}" for i in range(CFG.layers)]
        )
    else:
        wrapped = nn.parallel.DistributedDataParallel(model, process_group=data_group)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2, weight_decay=0.1, eps=ADAM_EPS)
    losses = []
    d = mesh.coordinate(kind)
    for step in range(3):
        tokens, targets = _batch(100 + step, 4)
        loss = loss_fn(wrapped(tokens[2 * d : 2 * d + 2]), targets[2 * d : 2 * d + 2])
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, group=data_group)
        losses.append(total.item() / 2)
        opt.step()
        opt.zero_grad()
    state = wrapped.state_dict() if kind == "fsdp" else model.state_dict()
    full = {n: tp.full_tensor(t, infos.get(n), tp_group) for n, t in state.items()}
    return losses, full


def _reference_training(dtype=torch.float32):
    model = _gpt().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, eps=ADAM_EPS)
    losses = []
    for step in range(3):
        loss = model.loss(*_batch(100 + step, 4))
        loss.backward()
        losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return losses, model.state_dict()


def _mesh_parity(rank, world, kind):
    if world != 4:
        return
    ref_losses, ref_state = _reference_training()
    _, exact = _reference_training(torch.float64)
    losses, state = _train_mesh(rank, world, kind)
    for step, (a, b) in enumerate(zip(losses, ref_losses, strict=True)):
        assert abs(a - b) <= 1e-5 * abs(b), f"{kind} x tp step {step}: loss {a} vs {b}"
    assert set(state) == set(ref_state), sorted(set(state) ^ set(ref_state))
    # Parameters: within 1e-5 of single-process fp32 AdamW, or, where fp32 itself is further
    # from the fp64 run (the key bias, whose gradient is rounding noise: softmax ignores it),
    # within 2x torch's own fp32 error.
    for name, ref in ref_state.items():
        err, torch_err = _rel(state[name], exact[name]), _rel(ref, exact[name])
        assert _rel(state[name], ref) <= 1e-5 or err <= 2 * torch_err, (
            f"{kind} x tp: {name} error against fp64 {err:.2e}, torch fp32's {torch_err:.2e}"
        )


def tp_x_fsdp_mesh_matches_single_process_adamw(rank, world, gloo):
    """Catches: FSDP over the data axis of a TP model sharding or averaging over the wrong
    ranks, or TP collectives crossing data replicas (the 2 x 2 fsdp x tp mesh, 4 ranks)."""
    _mesh_parity(rank, world, "fsdp")


def tp_x_dp_mesh_matches_single_process_adamw(rank, world, gloo):
    """Catches: DDP over the data axis of a TP model averaging over the TP ranks too."""
    _mesh_parity(rank, world, "dp")


def tp_mesh_groups_hold_the_described_ranks(rank, world, gloo):
    """Catches: a mesh group built with other ranks than describe() lists (tp must be adjacent
    ranks), or an axis group that spans another axis."""
    if world != 4:
        mesh = Mesh([[world], ["tp"]])
        assert mesh.ranks("tp") == list(range(world))
        return
    mesh = Mesh([[2, 2], ["fsdp", "tp"]])
    assert mesh.ranks("tp") == [rank - rank % 2, rank - rank % 2 + 1], mesh.describe()
    assert mesh.ranks("fsdp") == [rank % 2, rank % 2 + 2], mesh.describe()
    for axis in ("tp", "fsdp"):
        t = torch.tensor([float(1 << rank)])
        dist.all_reduce(t, group=mesh.group(axis))
        assert t.item() == sum(1 << r for r in mesh.ranks(axis)), (axis, t.item())
    assert "tp groups: [0, 1] [2, 3]" in mesh.describe(), mesh.describe()
    assert mesh.group("pp") is None and mesh.size("pp") == 1


def tp_bad_input_is_refused_before_anything_changes(rank, world, gloo):
    """Catches: an indivisible dimension or head count found only after some parameters were
    cut (or at the first forward), an unknown axis or a mesh of the wrong size accepted."""
    model = nn.Sequential(nn.Linear(8, 4 * world + 1), nn.Linear(4 * world + 1, 8))
    before = [p.clone() for p in model.parameters()]
    plan = {"0": tp.ColwiseParallel(), "1": tp.RowwiseParallel()}
    _expect(
        lambda: tp.parallelize(model, dist.group.WORLD, plan),
        ["module '0'", f"output features = {4 * world + 1}", "tp size that divides"],
    )
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    odd_heads = GPTConfig(vocab_size=256, seq_len=16, dim=64, layers=1, heads=world + 1)
    gpt = _gpt(cfg=odd_heads)
    _expect(
        lambda: tp.parallelize(gpt, dist.group.WORLD, tp.gpt_plan(gpt)),
        ["blocks.0.qkv", f"heads = {world + 1}", "divisible"],
    )
    typo = {"blocks.*.qkvv": tp.ColwiseParallel()}
    _expect(
        lambda: tp.parallelize(_gpt(), dist.group.WORLD, typo),
        ["'blocks.*.qkvv' matches no module"],
    )
    _expect(lambda: Mesh([[2, 3], ["fsdp", "tp"]]), ["multiply to 6 ranks", f"has {world}"])
    _expect(lambda: Mesh([[world], ["tensor"]]), ["'tensor' is not valid", "pp, dp, fsdp, tp"])


def tp_planner_counts_match_a_real_step(rank, world, gloo):
    """The planner's per-rank tp costs against one real fp32 step of the GPT at tp = world:
    the activation bytes it measures through a do-nothing group (``shape_only_group``) equal
    what autograd saves here, and its Megatron-LM traffic count (plus SP's backward re-gathers)
    equals every collective's ring traffic counted by ``CommCounter`` (with save_gathered: no
    re-gathers, the gathered inputs saved instead). Catches: a planner that estimates tp
    activations unsplit, a layer that communicates more (or less) than the theory, a
    collective added or dropped in a style, save_gathered still re-gathering."""
    from shardwise.comm_count import CommCounter
    from shardwise.train import gpt_costs

    tokens, targets = _batch(5, 2)
    for sp, keep in ((False, False), (True, False), (True, True)):
        plan = tp.gpt_plan(_gpt(), sp, save_gathered=keep)
        model = tp.parallelize(_gpt(), dist.group.WORLD, plan)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        saved: dict[int, int] = {}

        def pack(t, saved=saved, params=params):
            if t.untyped_storage().data_ptr() not in params:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        counter = CommCounter(group_size=world)
        with counter:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = model.loss(tokens, targets)
            loss.backward()
        planned = gpt_costs._saved_bytes(CFG, 2, False, world, sp, keep)
        what = f"sp={sp} save_gathered={keep}"
        assert planned == sum(saved.values()), f"{what}: {planned} vs {sum(saved.values())}"
        theory = gpt_costs.gpt_tp_communication_bytes(CFG, 2, sp, 4, world)
        expected = theory["total"] + (0 if keep else theory["regather"])
        err = abs(counter.total_wire - expected) / expected
        assert err <= 1e-9, f"{what}: {counter.total_wire} bytes sent, theory {expected}"


def _expect(fn, words):
    try:
        fn()
    except (ValueError, TypeError) as e:
        for w in words:
            assert w in str(e), f"{w!r} not in {e}"
    else:
        raise AssertionError(f"no error; expected one naming {words}")


CHECKS = [f for n, f in sorted(globals().items()) if n.startswith("tp_")]
