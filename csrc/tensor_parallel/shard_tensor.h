// Cutting a full tensor into this rank's tensor-parallel shard. A fused dimension (e.g. a QKV
// weight's rows [q; k; v]) is treated as `chunks` equal parts, each split over the ranks, and
// the rank's slices of every part are concatenated, so the shard holds its own heads of q, of k
// and of v. gather_shards is the inverse: the full tensor from every rank's shard.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "sharding/checkpoint_pieces.h"
#include "tensor_parallel/regions.h"

namespace shardwise::tensor_parallel {

struct ShardSpec {
  int64_t dim = 0;     // the split dimension
  int64_t chunks = 1;  // fused parts along it (3 for QKV)
  int rank = 0;        // this rank in the tensor-parallel group
  int size = 1;        // the group's size
  std::string module;  // for error messages: the module the tensor belongs to
  std::string name;    // and its name there (weight, bias)
};

// A contiguous copy of `full`'s shard. Throws c10::ValueError naming spec.module when the
// dimension does not split evenly.
at::Tensor shard_tensor(const at::Tensor& full, const ShardSpec& spec);

// The full tensor from this rank's `shard` (shard_tensor's cut with `spec`) and every other
// rank's: all-gathered along spec.dim over `group` (rank-major: each rank's slices of the
// `chunks` parts), then reordered part-major. Collective; `group` must have spec's rank and size.
at::Tensor gather_shards(const at::Tensor& shard, const ShardSpec& spec, const Group& group);

// The checkpoint slots of `shard` (shard_tensor's cut with `spec` of the tensor `name` of shape
// `full_shape`): one 1-D view of `shard` per run of shard_runs, starting where that run lies in
// the flattened full tensor. Pieces saved from them load at any tp size (and into an unsplit
// model). `shard` must be contiguous.
std::vector<sharding::TensorSlice> shard_slices(const std::string& name,
                                                const at::Tensor& shard,
                                                const std::vector<int64_t>& full_shape,
                                                const ShardSpec& spec);

}  // namespace shardwise::tensor_parallel
