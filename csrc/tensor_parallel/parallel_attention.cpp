#include "tensor_parallel/parallel_attention.h"

#include <ATen/ATen.h>

namespace shardwise::tensor_parallel {

at::Tensor parallel_self_attention(const at::Tensor& x,
                                   const AttentionWeights& weights,
                                   int64_t local_heads,
                                   bool causal,
                                   const ParallelOptions& options) {
  constexpr const char* op = "tensor_parallel.parallel_self_attention";
  TORCH_CHECK_VALUE(x.dim() == 3, op, ": x must be [batch, seq, hidden], got ", x.sizes());
  TORCH_CHECK_VALUE(options.sequence_dim == 1 || options.sequence_dim == -2, op,
                    ": options.sequence_dim must be 1 for [batch, seq, hidden]");
  const int64_t rows = weights.qkv_weight.size(0);
  TORCH_CHECK_VALUE(local_heads > 0 && rows % (3 * local_heads) == 0, op, ": qkv_weight has ", rows,
                    " rows, not 3 * local_heads (", local_heads, ") * head_dim");
  const int64_t head_dim = rows / (3 * local_heads);
  auto to_optional = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  };
  const at::Tensor qkv =
      column_parallel_linear(x, weights.qkv_weight, to_optional(weights.qkv_bias), options);
  const int64_t batch = qkv.size(0), seq = qkv.size(1);  // the whole sequence, also under SP
  auto parts = qkv.view({batch, seq, 3, local_heads, head_dim}).unbind(2);
  const at::Tensor attn = at::scaled_dot_product_attention(
      parts[0].transpose(1, 2), parts[1].transpose(1, 2), parts[2].transpose(1, 2),
      /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0, causal);
  const at::Tensor merged = attn.transpose(1, 2).reshape({batch, seq, local_heads * head_dim});
  return row_parallel_linear(merged, weights.proj_weight, to_optional(weights.proj_bias), options);
}

}  // namespace shardwise::tensor_parallel
