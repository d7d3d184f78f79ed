// Shapes of tensor-parallel shards (torch-free): which slice of a split dimension a rank holds,
// and the divisibility checks that name the module, the dimension and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardwise::tensor_parallel {

struct ShardRange {
  int64_t start = 0;  // first index of the rank's slice
  int64_t size = 0;   // its length (total / tp_size)
};

// Rank `tp_rank`'s contiguous slice of a dimension of `total` elements split over `tp_size`
// ranks. Throws std::invalid_argument naming `module` and `dimension` unless tp_size divides
// total (the fix: a tp size that divides it, or padding the dimension).
ShardRange shard_range(int64_t total,
                       int tp_rank,
                       int tp_size,
                       const std::string& module,
                       const std::string& dimension);

// Throws std::invalid_argument naming `module` and `dimension` unless tp_size divides `total`.
void check_divisible(int64_t total,
                     int tp_size,
                     const std::string& module,
                     const std::string& dimension);

// A contiguous run of a shard's elements inside the flattened full tensor.
struct ShardRun {
  int64_t full_start = 0;   // index in the full tensor, flattened row-major
  int64_t local_start = 0;  // index in the shard, flattened row-major
  int64_t length = 0;
};

// Where the shard of rank `tp_rank` (the full tensor of shape `full_shape` split along `dim` over
// `tp_size` ranks, each of `chunks` fused parts separately) lies in the flattened full tensor:
// its runs in shard order, each as long as possible (dim 0 without fused parts: one run). The
// world-size-independent checkpoint pieces of a split parameter are these runs. Throws
// std::invalid_argument when the dimension does not split evenly.
std::vector<ShardRun> shard_runs(
    const std::vector<int64_t>& full_shape, int64_t dim, int64_t chunks, int tp_rank, int tp_size);

}  // namespace shardwise::tensor_parallel
