"""What the bundled GPT costs per rank under each parallelism, for the planner (``planner.py``):
parameters per tensor-parallel rank and per pipeline stage (counted on the model), activation
bytes (measured with autograd's saved-tensor hooks, also for a tensor-parallel rank through a
process group whose collectives do nothing), the units FSDP gathers, and the tensor-parallel
communication per step (Megatron-LM's count from the shapes)."""

from __future__ import annotations

from dataclasses import replace

from .state_bytes import state_bytes_per_param


def gpt_tp_parameters(cfg, tp: int, sequence_parallel: bool = False) -> int:
    """Parameters per tensor-parallel rank of the bundled GPT under ``gpt_plan`` (exact: counted
    on a meta-device model)."""
    import torch

    from .. import tensor_parallel
    from ..models.gpt import GPT

    with torch.device("meta"):
        model = GPT(cfg)
    plan = tensor_parallel.gpt_plan(model, sequence_parallel)
    return tensor_parallel.parameters_per_rank(model, plan, tp)


def gpt_largest_stage_params(cfg, stages: int) -> int:
    """Parameters of the largest stage when the bundled GPT is cut into ``stages`` by parameter
    count as ``shardwise.pipeline.split_by_parameters`` cuts it (embedding, whole blocks, and
    the final norm with the head's copy of the tied embedding)."""
    from .. import _C

    d = cfg.dim
    per_block = (cfg.num_parameters() - cfg.vocab_size * d - cfg.seq_len * d - 2 * d) // cfg.layers
    sizes = [cfg.vocab_size * d + cfg.seq_len * d, *([per_block] * cfg.layers)]
    sizes.append(2 * d + cfg.vocab_size * d)
    starts = [*_C.balanced_partition([float(x) for x in sizes], stages), len(sizes)]
    return max(sum(sizes[starts[k] : starts[k + 1]]) for k in range(stages))


def shape_only_group(size: int):
    """A process group of ``size`` ranks, this one rank 0, whose collectives do nothing (torch's
    ``FakeProcessGroup``): a tensor-parallel model runs on it with the right shapes (not the
    right values), so what one tp rank saves for backward can be measured in one process."""
    import torch
    from torch._C._distributed_c10d import FakeProcessGroup, HashStore, ProcessGroup

    group = ProcessGroup(HashStore(), 0, size)
    backend = FakeProcessGroup._create_internal(0, size)
    group._register_backend(torch.device("cpu"), ProcessGroup.BackendType.CUSTOM, backend)
    group._set_default_backend(ProcessGroup.BackendType.CUSTOM)
    return group


def _rank_model(gpt_config, tp: int, sequence_parallel: bool, save_gathered: bool):
    """The bundled GPT as one rank holds it: whole, or tp rank 0 of it cut by ``gpt_plan`` over
    ``shape_only_group(tp)``. Built under the caller's fake mode, if any."""
    from ..models.gpt import GPT

    model = GPT(gpt_config)
    if tp > 1:
        from .. import tensor_parallel

        plan = tensor_parallel.gpt_plan(model, sequence_parallel, save_gathered=save_gathered)
        tensor_parallel.parallelize(model, shape_only_group(tp), plan)
    return model


def gpt_traces(
    gpt_config,
    micro_batch_size: int,
    bf16: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
    save_gathered: bool = False,
):
    """The operators of one micro-batch of the bundled GPT on one rank (``op_trace``, on fake
    tensors): (forward + loss + backward, forward + loss alone)."""
    from .op_trace import trace_training_step

    def build():
        return _rank_model(gpt_config, tp, sequence_parallel, save_gathered)

    shape = (micro_batch_size, gpt_config.seq_len)
    return (
        trace_training_step(build, shape, bf16),
        trace_training_step(build, shape, bf16, backward=False),
    )


def _saved_bytes(
    gpt_config,
    micro_batch_size: int,
    bf16: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
    save_gathered: bool = False,
    fake: bool = True,
) -> int:
    """Bytes autograd saves for backward in one forward + loss of the bundled GPT (storages
    other than the parameters, each counted once), measured with saved_tensors_hooks; with
    ``tp`` > 1, on tp rank 0 of the model cut by ``gpt_plan`` (``shape_only_group``). Traced on
    fake tensors (``FakeTensorMode``): shapes, dtypes and storages as in a real run, no memory
    allocated, so a model of any size is measured on any machine (a 262k vocabulary's logits
    alone would take gigabytes). A storage is told apart by its StorageImpl (``_cdata``): fake
    storages have no data pointer. ``fake=False`` runs the same on real tensors (tests compare)."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
        model = _rank_model(gpt_config, tp, sequence_parallel, save_gathered)
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        saved: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage._cdata not in params:
                saved[storage._cdata] = storage.nbytes()
            return t

        tokens = torch.zeros(micro_batch_size, gpt_config.seq_len, dtype=torch.long)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                model.loss(tokens, tokens)
    return sum(saved.values())


def gpt_activation_bytes(
    gpt_config,
    micro_batch_size: int,
    mixed_precision: str = "bf16",
    checkpointing: bool = False,
    tp: int = 1,
    sequence_parallel: bool = False,
    save_gathered: bool = False,
) -> int:
    """Activation bytes of one microbatch through the bundled GPT as shardwise-train runs it
    (bf16 autocast or fp32), measured rather than modelled, on one tp rank when ``tp`` > 1.
    What autograd saves in a forward is ``f(L, b) = c0 + cL·L + b·(s0 + sL·L)`` for L layers and
    b sequences: per-forward constants (under autocast the bf16 copies of the weights, cL per
    layer) and per-sequence bytes (sL per layer, s0 for embeddings, head and loss). Four
    forwards of the same model with L, b in {1, 2} give the four terms. With activation
    checkpointing each block keeps only its input (b·s·h·4 bytes, the residual stream stays
    fp32; split t ways under sequence parallelism) and one block's activations exist at a time
    while it is recomputed."""
    bf16 = mixed_precision != "fp32"
    f = {
        (n, b): _saved_bytes(
            replace(gpt_config, layers=n), b, bf16, tp, sequence_parallel, save_gathered
        )
        for n in (1, 2)
        for b in (1, 2)
    }
    s_layer = f[2, 2] - f[1, 2] - (f[2, 1] - f[1, 1])
    c_layer = f[2, 1] - f[1, 1] - s_layer
    s_rest = f[1, 2] - f[1, 1] - s_layer
    c_rest = f[1, 1] - c_layer - s_rest - s_layer
    b, layers = micro_batch_size, gpt_config.layers
    if checkpointing:
        split = tp if sequence_parallel else 1
        inputs = layers * gpt_config.seq_len * gpt_config.dim * 4 // split
        return int(c_rest + c_layer * layers + b * (s_rest + s_layer + inputs))
    return int(c_rest + c_layer * layers + b * (s_rest + s_layer * layers))


def gpt_gather_bytes(gpt_config, mixed_precision: str = "bf16", tp: int = 1) -> int:
    """Transient bytes ZeRO-3 / FSDP full_shard holds for the GPT's unsharded units: with
    transformer-block wrapping the units are each block and the root (embeddings, tied head,
    final norm); at worst the largest unit and the prefetched next one are gathered, plus the
    largest unit's unsharded gradients before the reduce-scatter, i.e.
    ``largest × (2 × param bytes + grad bytes)``; a tp rank's units are about 1 / tp of that."""
    param_b, grad_b, _ = state_bytes_per_param(mixed_precision, "adamw")
    root = (gpt_config.vocab_size + gpt_config.seq_len + 2) * gpt_config.dim
    block = (gpt_config.num_parameters() - root) // gpt_config.layers
    return max(root, block) * (2 * param_b + grad_b) // tp


def gpt_tp_communication_bytes(
    cfg, micro_batch_size: int, sequence_parallel: bool, block_bytes: int, tp: int
) -> dict:
    """Megatron-LM's count for the GPT under ``gpt_plan``, per rank and micro-batch, as ring
    traffic (an all-reduce sends 2(t-1)/t of its payload, an all-gather or reduce-scatter
    (t-1)/t): A = batch × seq × dim activations, in ``block_bytes`` per element inside the blocks
    (the autocast dtype) and 4 for the embedding's output (outside autocast) and the loss.
    No SP: per block 2 all-reduces of A forward (after proj, after down) and 2 backward (the
    input gradients of qkv and up), the embedding's all-reduce forward, the head's input
    gradient backward, and the vocabulary-parallel loss's 3 reductions of batch × seq floats.
    SP: every all-reduce becomes an all-gather + a reduce-scatter (same ring traffic), plus
    the position-embedding gradient's all-gather (seq × dim) and the replicated norm and row
    biases' gradient all-reductions (dim floats each). This is the minimum, with every gathered
    activation kept for backward; shardwise's SP column-parallel layer re-gathers its input in
    backward to save that memory (as Megatron-LM's does), adding ``regather``: an all-gather of
    A per column-parallel layer (none with ``save_gathered``). Returns {"blocks", "regather",
    "total"} (total without it)."""
    a = micro_batch_size * cfg.seq_len * cfg.dim
    ring_ar, ring_half = 2 * (tp - 1) / tp, (tp - 1) / tp
    blocks = 4 * cfg.layers * a * block_bytes * ring_ar
    ends = a * 4 * ring_ar + a * block_bytes * ring_ar  # embedding forward, head backward
    loss = 3 * micro_batch_size * cfg.seq_len * 4 * ring_ar
    small, regather = 0.0, 0.0
    if sequence_parallel:
        small += cfg.seq_len * cfg.dim * 4 * ring_half  # position-embedding gradient
        norms = 2 * cfg.layers + 1
        small += (2 * norms + 2 * cfg.layers) * cfg.dim * 4 * ring_ar  # norm w/b + row biases
        regather = (2 * cfg.layers + 1) * a * block_bytes * ring_half  # qkv, up, head
    return {"blocks": blocks, "regather": regather, "total": blocks + ends + loss + small}


def activation_bytes(
    gpt_config,
    micro_batch_size: int,
    dtype_bytes: int = 2,
    checkpointing: bool = False,
    *,
    seq_len: int | None = None,
    attention_scores: bool = True,
) -> int:
    """Activation bytes of one microbatch through a ``GPTConfig`` model (s = sequence, b = batch,
    h = dim, a = heads, L = layers, V = vocabulary).

    Per transformer layer, from Korthikanti et al. 2022 ("Reducing Activation Recomputation in
    Large Transformer Models", arXiv 2205.05198, eq. 1, no tensor parallelism), in half
    precision: ``s·b·h·(34 + 5·a·s/h)`` bytes; ``34·s·b·h`` are the saved layer inputs, QKV,
    MLP and norm activations (and 1-byte dropout masks), ``5·a·s²·b`` the attention scores,
    softmax and its dropout mask. For ``dtype_bytes`` other than 2 it is scaled by
    ``dtype_bytes / 2``. ``attention_scores=False`` drops the ``5·a·s/h`` term (fused SDPA /
    flash attention keeps no s² matrices). Plus the head: logits ``s·b·V·dtype_bytes`` and their
    fp32 copy for the loss ``s·b·V·4`` (``GPT.loss`` casts with ``.float()``; none in fp32).

    With ``checkpointing`` (full recomputation per block) only each block's input is kept,
    ``L·s·b·h·dtype_bytes``, plus one block's full activations while it is recomputed.
    """
    for name, value in (("micro_batch_size", micro_batch_size), ("dtype_bytes", dtype_bytes)):
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    s = seq_len if seq_len is not None else gpt_config.seq_len
    b, h, a = micro_batch_size, gpt_config.dim, gpt_config.heads
    per_token = 34 + (5 * a * s / h if attention_scores else 0)
    layer = s * b * h * per_token * dtype_bytes / 2
    head = s * b * gpt_config.vocab_size * (dtype_bytes + (4 if dtype_bytes != 4 else 0))
    if checkpointing:
        blocks = gpt_config.layers * s * b * h * dtype_bytes + layer
    else:
        blocks = gpt_config.layers * layer
    return int(blocks + head)
