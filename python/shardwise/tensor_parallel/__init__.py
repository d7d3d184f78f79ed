"""Tensor parallelism (Megatron-style), with the layers in C++ (``csrc/tensor_parallel/``):
column- and row-parallel linear layers, attention with heads split across ranks, a
vocabulary-parallel embedding and cross-entropy, and sequence parallelism, over any
``torch.distributed`` process group (the shardwise backend, gloo, NCCL).

``parallelize(model, tp_group, plan)`` applies a plan (module-name patterns -> styles) in place,
in the spirit of DTensor's ``parallelize_module``; ``gpt_plan`` is the ready plan for the bundled
GPT, ``llama_plan`` the documented one for Llama-style blocks and ``hf_plan`` the one for a
Hugging Face GPT-2 or Llama-family model (``transformers``' own module names)."""

from .functional import (
    column_parallel_linear,
    copy_to_region,
    cross_entropy,
    gather_along,
    parallel_self_attention,
    reduce_from_region,
    reduce_scatter_along,
    row_parallel_linear,
    scatter_along,
    vocab_parallel_embedding,
)
from .hf_plans import hf_plan
from .parallelize import (
    clip_grad_norm_,
    full_tensor,
    gpt_plan,
    llama_plan,
    parallelize,
    parameters_per_rank,
    shard_runs,
    tp_info,
)
from .styles import (
    ColwiseParallel,
    LocalCounts,
    LossParallel,
    RowwiseParallel,
    ScatterSequence,
    SequenceParallel,
    VocabParallelEmbedding,
)

__all__ = [
    "ColwiseParallel",
    "LocalCounts",
    "LossParallel",
    "RowwiseParallel",
    "ScatterSequence",
    "SequenceParallel",
    "VocabParallelEmbedding",
    "clip_grad_norm_",
    "column_parallel_linear",
    "copy_to_region",
    "cross_entropy",
    "full_tensor",
    "gather_along",
    "gpt_plan",
    "hf_plan",
    "llama_plan",
    "parallel_self_attention",
    "parallelize",
    "parameters_per_rank",
    "reduce_from_region",
    "reduce_scatter_along",
    "row_parallel_linear",
    "scatter_along",
    "shard_runs",
    "tp_info",
    "vocab_parallel_embedding",
]
