// Self-attention with its heads split across the tensor-parallel ranks: a column-parallel fused
// QKV projection (this rank's rows of q, of k and of v: `local_heads` heads each), scaled
// dot-product attention over those heads, and a row-parallel output projection. Activations are
// [batch, seq, hidden]; with sequence_parallel they arrive and leave split along the sequence.
#pragma once

#include <ATen/core/Tensor.h>

#include "tensor_parallel/parallel_linear.h"

namespace shardwise::tensor_parallel {

struct AttentionWeights {
  at::Tensor qkv_weight;   // [3 * local_heads * head_dim, hidden]: q rows, then k, then v
  at::Tensor qkv_bias;     // [3 * local_heads * head_dim] or undefined
  at::Tensor proj_weight;  // [hidden, local_heads * head_dim]
  at::Tensor proj_bias;    // [hidden] (replicated) or undefined
};

at::Tensor parallel_self_attention(const at::Tensor& x,
                                   const AttentionWeights& weights,
                                   int64_t local_heads,
                                   bool causal,
                                   const ParallelOptions& options);

}  // namespace shardwise::tensor_parallel
