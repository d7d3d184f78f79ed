"""What the bundled GPT costs per rank under each parallelism, for the planner (``planner.py``):
parameters per tensor-parallel rank and per pipeline stage (counted on the model), activation
bytes (the peak of a forward + backward traced on fake tensors by torch's MemTracker, also for
a tensor-parallel rank through a process group whose collectives do nothing), the units FSDP
gathers, and the tensor-parallel communication per step (Megatron-LM's count from the
shapes)."""

from __future__ import annotations

import functools

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
    """The model as one rank holds it: a model the config builds (``ModelShape.builder``)
    itself, else the bundled GPT whole, or tp rank 0 of it cut by ``gpt_plan`` over
    ``shape_only_group(tp)`` (another model under tp is traced as the GPT of its sizes). Built
    under the caller's fake mode, if any."""
    from ..models.gpt import GPT

    if tp == 1 and getattr(gpt_config, "builder", None) is not None:
        return gpt_config.builder(weights=False)  # a Hugging Face or factory model, itself
    model = GPT(gpt_config)
    if tp > 1:
        from .. import tensor_parallel

        plan = tensor_parallel.gpt_plan(model, sequence_parallel, save_gathered=save_gathered)
        tensor_parallel.parallelize(model, shape_only_group(tp), plan)
    return model


@functools.lru_cache(maxsize=16)
def parameter_tensors(gpt_config) -> int:
    """The parameter tensors of the model (a tied embedding once; a tp rank holds a piece of
    each), counted on a meta-device model: an optimizer pays a fixed cost per tensor."""
    import torch

    with torch.device("meta"):
        model = _rank_model(gpt_config, 1, False, False)
    return sum(1 for p in model.parameters() if p.requires_grad)


@functools.lru_cache(maxsize=16)
def gpt_traces(
    gpt_config,
    micro_batch_size: int,
    bf16: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
    save_gathered: bool = False,
    low_params: bool = False,
):
    """The operators of one micro-batch of the bundled GPT on one rank (``op_trace``, on fake
    tensors): (forward + loss + backward, forward + loss alone); ``low_params``: in bf16
    parameters without autocast (``op_trace.trace_training_step``). Kept per model and shape:
    a plan of several cluster sizes traces once."""
    from .op_trace import trace_training_step

    def build():
        return _rank_model(gpt_config, tp, sequence_parallel, save_gathered)

    shape = (micro_batch_size, gpt_config.seq_len)
    return (
        trace_training_step(build, shape, bf16, low_params=low_params),
        trace_training_step(build, shape, bf16, backward=False, low_params=low_params),
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


def _activation_peak_tracker():
    """torch's ``MemTracker`` that also keeps the largest sum of activation and temporary bytes
    seen after any operator (its own peak snapshot is taken where the total, parameters and
    gradients included, peaks: at the end of backward for a small model, where no activation
    is left)."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    class ActivationPeak(MemTracker):
        activation_peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            live = sum(
                at[_MemRefType.ACT] + at[_MemRefType.TEMP]
                for at in self.get_tracker_snapshot().values()
            )
            self.activation_peak = max(self.activation_peak, live)
            return out

    return ActivationPeak()


@functools.lru_cache(maxsize=64)
def _peak_bytes(
    gpt_config,
    micro_batch_size: int,
    bf16: bool,
    tp: int = 1,
    sequence_parallel: bool = False,
    save_gathered: bool = False,
    checkpointing: bool = False,
    fake: bool = True,
    low_params: bool = False,
) -> int:
    """The most activation and temporary bytes live at once in one forward + loss + backward of
    the bundled GPT (``_rank_model``), tracked by torch's ``MemTracker``
    (``torch.distributed._tools.mem_tracker``) on fake tensors: what autograd saves, autocast's
    weight copies, the backward's transients (the logits' gradient, the fp32 loss's copies), and
    with ``checkpointing`` the blocks' inputs plus the block being recomputed
    (``recompute.checkpoint_blocks``, the trainer's own rule). Parameters and gradients are left
    out: the planner counts them from each row's layout. Fake tensors allocate nothing, so the
    whole model is traced at its own depth and micro-batch (a 262k vocabulary's logits would
    take gigabytes); ``fake=False`` runs the same on real tensors (tests compare).
    ``low_params``: the parameters in bf16 and no autocast (ZeRO, FSDP's mixed precision)."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .op_trace import build_with_parameters

    with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
        model = build_with_parameters(
            lambda: _rank_model(gpt_config, tp, sequence_parallel, save_gathered),
            torch.bfloat16 if low_params else None,
        )
        if checkpointing:
            from .recompute import checkpoint_blocks

            checkpoint_blocks(model.blocks)
        tokens = torch.zeros(micro_batch_size, gpt_config.seq_len, dtype=torch.long)
        tracker = _activation_peak_tracker()
        tracker.track_external(model)
        autocast = bf16 and not low_params
        with tracker, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model.loss(tokens, tokens).backward()
    return tracker.activation_peak


def gpt_activation_bytes(
    gpt_config,
    micro_batch_size: int,
    mixed_precision: str = "bf16",
    checkpointing: bool = False,
    tp: int = 1,
    sequence_parallel: bool = False,
    save_gathered: bool = False,
    low_params: bool = False,
) -> int:
    """Activation bytes of one microbatch through the bundled GPT as shardwise-train runs it
    (fp32, bf16 autocast or with ``low_params`` bf16 parameters, activation checkpointing or
    not), on one tp rank when ``tp`` > 1:
    the peak of the whole model's forward + backward traced on fake tensors (``_peak_bytes``),
    never a formula."""
    bf16 = mixed_precision != "fp32"
    return _peak_bytes(
        gpt_config,
        micro_batch_size,
        bf16,
        tp,
        sequence_parallel,
        save_gathered,
        checkpointing,
        low_params=low_params,
    )


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


def _greedy_buckets(sizes: list[int], cap: int) -> int:
    """Buckets of consecutive sizes, each closed before the next size would pass ``cap`` (the
    ZeRO engine's rule: C++ ``zero::ZeroOptimizer``'s bucket assignment)."""
    buckets, current = 0, 0
    for size in sizes:
        if current and current + size > cap:
            buckets, current = buckets + 1, 0
        current += size
    return buckets + int(current > 0)


@functools.lru_cache(maxsize=16)
def engine_counts(
    gpt_config,
    full,
    forward,
    reduce_bucket_numel: int = 500_000_000,
    allgather_bucket_numel: int = 500_000_000,
):
    """``step_collectives.EngineCounts`` of the model: its wrapped units (the blocks and the
    root), torch DDP's gradient buckets (torch's own assignment over the fp32 gradients, in
    the reverse order of the parameters, at DDP's default caps), the ZeRO engine's buckets, and
    the collectives of the traced micro-batch ``full`` and forward ``forward`` (a tp rank's)."""
    from collections import Counter

    import torch
    import torch.distributed as dist

    from .step_collectives import EngineCounts

    with torch.device("meta"):
        model = _rank_model(gpt_config, 1, False, False)
    params = [p for p in model.parameters() if p.requires_grad]
    fp32 = [torch.empty(p.shape, dtype=torch.float32, device="meta") for p in reversed(params)]
    caps = [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20]  # torch DDP's defaults
    ddp, _ = dist._compute_bucket_assignment_by_size(fp32, caps)
    sizes = [p.numel() for p in params]
    shared = sum(1 for _ in model.named_parameters(remove_duplicate=False)) > len(params)
    return EngineCounts(
        units=gpt_config.layers + 1,
        ddp_buckets=len(ddp),
        zero_reduce_buckets=_greedy_buckets(sizes, reduce_bucket_numel),
        zero_gather_buckets=_greedy_buckets(sizes, allgather_bucket_numel),
        model=dict(Counter(full.collectives)),
        recomputed=dict(Counter(forward.collectives)),
        tied_embedding=shared,  # a tied head: the pipeline sends its gradient between stages
    )
