// The fused sharding copies for LibTorch users (and the FSDP engine). Each call goes through the
// dispatcher, exactly like torch.ops.shardwise.* in Python. Layout: sharding/flat_layout.h with
// pieces aligned to kShardAlign elements.
//
//   at::Tensor shard = shardwise::all_gather_copy_in(shards, numels, world, rank, at::kBFloat16);
//   // ... all-gather `shard` into `gathered` (world * shard.numel() elements) ...
//   std::vector<at::Tensor> full = shardwise::all_gather_copy_out(gathered, numels, world);
//   at::Tensor buffer = shardwise::reduce_scatter_copy_in(grads, numels, world, at::kFloat, 1.0);
//   // ... reduce-scatter `buffer` into `reduced` (buffer.numel() / world elements) ...
//   shardwise::reduce_scatter_copy_out_(reduced, numels, world, rank, 1.0, shard_grads);
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace shardwise {

constexpr int64_t kShardAlign = 16;  // elements per alignment unit of a parameter's piece

// This rank's piece of every parameter (shards[i] holds the elements it owns: 1-D, numel equal to
// the layout's valid(i, rank)) packed into one 1-D shard of `dtype`, cast in the same pass,
// padding zeroed.
at::Tensor all_gather_copy_in(at::TensorList shards,
                              at::IntArrayRef numels,
                              int64_t world_size,
                              int64_t rank,
                              at::ScalarType dtype);

// Full flat parameters (1-D, numels[i] elements each, the dtype of `gathered`) out of the
// all-gathered buffer of world_size shards.
std::vector<at::Tensor> all_gather_copy_out(const at::Tensor& gathered,
                                            at::IntArrayRef numels,
                                            int64_t world_size);

// In-place form: writes into `params` (contiguous, numels[i] elements each, gathered's dtype), so a
// buffer whose storage is freed and re-allocated keeps the same tensors (and their views).
void all_gather_copy_out_(const at::Tensor& gathered,
                          at::IntArrayRef numels,
                          int64_t world_size,
                          at::TensorList params);

// The reduce-scatter input: every gradient (flat numels[i] elements, or none: zeros) cut into
// rank-major pieces, cast to `dtype` and multiplied by `scale` (the pre-divide) in one pass.
at::Tensor reduce_scatter_copy_in(const std::vector<std::optional<at::Tensor>>& grads,
                                  at::IntArrayRef numels,
                                  int64_t world_size,
                                  at::ScalarType dtype,
                                  double scale);

// In-place form into a caller-owned `buffer` (contiguous, world_size * shard_numel elements, on
// the gradients' device; its dtype is the reduce dtype), so a reused buffer skips the allocation
// and, on CPU, the first-touch page faults of a fresh one.
void reduce_scatter_copy_in_(const std::vector<std::optional<at::Tensor>>& grads,
                             at::IntArrayRef numels,
                             int64_t world_size,
                             double scale,
                             const at::Tensor& buffer);

// New sharded gradients (1-D, valid(i, rank) elements, `dtype`) = reduced piece * scale.
std::vector<at::Tensor> reduce_scatter_copy_out(const at::Tensor& reduced,
                                                at::IntArrayRef numels,
                                                int64_t world_size,
                                                int64_t rank,
                                                at::ScalarType dtype,
                                                double scale);

// In-place form: shard_grads[i] += reduced piece * scale, rounded once per element, or with
// accumulate = false, shard_grads[i] = reduced piece * scale (no zero-fill pass needed).
void reduce_scatter_copy_out_(const at::Tensor& reduced,
                              at::IntArrayRef numels,
                              int64_t world_size,
                              int64_t rank,
                              double scale,
                              at::TensorList shard_grads,
                              bool accumulate = true);

}  // namespace shardwise
