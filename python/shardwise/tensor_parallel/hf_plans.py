"""Tensor-parallel plans for Hugging Face causal LMs: GPT-2 and the Llama family (Llama,
Mistral, Qwen2). ``hf_plan(model.config)`` is the plan for the transformers model itself;
``prefix`` names where it sits in a wrapper (``inner.`` in ``models.causal_lm.CausalLM``).

Both follow Megatron's cut: the token embedding split on the vocabulary, each attention's
query/key/value projections column-parallel by heads and its output projection row-parallel, the
MLP's up (and gate) column- and down row-parallel, and the output head column-parallel with the
vocabulary-parallel loss (logits never gathered). GPT-2's linear layers are ``Conv1D`` (weights
stored [in, out]) and its QKV is one fused projection cut as three parts; its attention splits
that output by ``split_size``, which becomes this rank's share (``LocalCounts``). Llama's
attention reshapes by ``head_dim`` with ``-1`` heads, so it runs on its local heads as it is.
Position embeddings, norms and the residual stream stay replicated."""

from __future__ import annotations

from . import styles as st

# model_type -> the family whose module names and forward the plan relies on
FAMILIES = {"gpt2": "gpt2", "llama": "llama", "mistral": "llama", "qwen2": "llama"}


def family(config) -> str | None:
    """``gpt2``, ``llama`` or None (a model type no plan covers)."""
    return FAMILIES.get(getattr(config, "model_type", None))


def divisible_sizes(config) -> list[tuple[str, int]]:
    """The (config field, value) pairs a tp size must divide, for ``config``'s family; raises
    ValueError for what the plans do not cover (cross-attention, a padding index in a
    vocabulary-parallel embedding)."""
    kind = family(config)
    if kind is None:
        raise ValueError(
            f"no tensor-parallel plan for model_type {getattr(config, 'model_type', None)!r}; "
            f"the plans cover {', '.join(sorted(FAMILIES))}"
        )
    if kind == "gpt2":
        if getattr(config, "add_cross_attention", False):
            raise ValueError("tensor parallelism: GPT-2 with add_cross_attention is not covered")
        inner = config.n_inner or 4 * config.n_embd
        return [
            ("n_head", config.n_head),
            ("n_embd", config.n_embd),
            ("n_inner", inner),
            ("vocab_size", config.vocab_size),
        ]
    if getattr(config, "pad_token_id", None) is not None:
        raise ValueError(
            f"tensor parallelism: the embedding's padding index (pad_token_id="
            f"{config.pad_token_id}) is not supported by the vocabulary-parallel embedding; "
            "set model.hf_overrides.pad_token_id to null (the trainer pads nothing)"
        )
    return [
        ("num_attention_heads", config.num_attention_heads),
        ("num_key_value_heads", config.num_key_value_heads or config.num_attention_heads),
        ("intermediate_size", config.intermediate_size),
        ("vocab_size", config.vocab_size),
    ]


def hf_plan(config, prefix: str = "") -> dict:
    """The plan for the transformers causal LM ``config`` describes, its modules named under
    ``prefix``; ValueError for a model no plan covers (``divisible_sizes``). After
    ``parallelize`` the model's ``cross_entropy(logits, targets)`` is the vocabulary-parallel
    loss."""
    divisible_sizes(config)  # refuses what no plan covers
    return {prefix + k: v for k, v in _plan(config).items()}


def _plan(config) -> dict:
    if family(config) == "gpt2":
        h = "transformer.h.*."
        return {
            "transformer.wte": st.VocabParallelEmbedding(),
            h + "attn": st.LocalCounts(("split_size", "num_heads", "embed_dim")),
            h + "attn.c_attn": st.ColwiseParallel(chunks=3, heads=config.n_head),
            h + "attn.c_proj": st.RowwiseParallel(),
            h + "mlp.c_fc": st.ColwiseParallel(),
            h + "mlp.c_proj": st.RowwiseParallel(),
            "lm_head": st.LossParallel(),
        }
    heads = config.num_attention_heads
    kv = config.num_key_value_heads or heads
    layer = "model.layers.*."
    return {
        "model.embed_tokens": st.VocabParallelEmbedding(),
        layer + "self_attn.q_proj": st.ColwiseParallel(heads=heads),
        layer + "self_attn.k_proj": st.ColwiseParallel(heads=kv),
        layer + "self_attn.v_proj": st.ColwiseParallel(heads=kv),
        layer + "self_attn.o_proj": st.RowwiseParallel(),
        layer + "mlp.gate_proj": st.ColwiseParallel(),
        layer + "mlp.up_proj": st.ColwiseParallel(),
        layer + "mlp.down_proj": st.RowwiseParallel(),
        "lm_head": st.LossParallel(),
    }
