#include "tensor_parallel/tp_shapes.h"

#include <stdexcept>

namespace shardwise::tensor_parallel {

void check_divisible(int64_t total,
                     int tp_size,
                     const std::string& module,
                     const std::string& dimension) {
  if (tp_size < 1) {
    throw std::invalid_argument("tensor parallel: tp size " + std::to_string(tp_size) +
                                " for module '" + module + "'; it must be >= 1");
  }
  if (total % tp_size != 0) {
    throw std::invalid_argument(
        "tensor parallel: module '" + module + "': " + dimension + " = " + std::to_string(total) +
        " is not divisible by the tensor-parallel size " + std::to_string(tp_size) +
        "; choose a tp size that divides " + std::to_string(total) + " or pad " + dimension +
        " to a multiple of " + std::to_string(tp_size));
  }
}

ShardRange shard_range(int64_t total,
                       int tp_rank,
                       int tp_size,
                       const std::string& module,
                       const std::string& dimension) {
  check_divisible(total, tp_size, module, dimension);
  if (tp_rank < 0 || tp_rank >= tp_size) {
    throw std::invalid_argument("tensor parallel: module '" + module + "': rank " +
                                std::to_string(tp_rank) + " is outside the group of " +
                                std::to_string(tp_size));
  }
  const int64_t size = total / tp_size;
  return {tp_rank * size, size};
}

std::vector<ShardRun> shard_runs(
    const std::vector<int64_t>& full_shape, int64_t dim, int64_t chunks, int tp_rank, int tp_size) {
  if (dim < 0 || dim >= static_cast<int64_t>(full_shape.size()) || chunks < 1) {
    throw std::invalid_argument("shard_runs: dim " + std::to_string(dim) + " or chunks " +
                                std::to_string(chunks) + " invalid for a " +
                                std::to_string(full_shape.size()) + "-D tensor");
  }
  // The tensor as [outer, extent, inner]: `outer` slabs before `dim`, `inner` elements after.
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= full_shape[d];
  for (size_t d = dim + 1; d < full_shape.size(); ++d) inner *= full_shape[d];
  const int64_t extent = full_shape[dim];
  if (extent % chunks != 0) {
    throw std::invalid_argument("shard_runs: dimension " + std::to_string(dim) + " (" +
                                std::to_string(extent) + ") is not " + std::to_string(chunks) +
                                " equal fused parts");
  }
  const int64_t part = extent / chunks;
  const ShardRange range = shard_range(part, tp_rank, tp_size, "shard_runs", "the split dimension");
  std::vector<ShardRun> runs;
  int64_t local = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t start = (o * extent + c * part + range.start) * inner;
      const int64_t length = range.size * inner;
      if (!runs.empty() && runs.back().full_start + runs.back().length == start) {
        runs.back().length += length;  // adjacent in the full tensor too: one run
      } else {
        runs.push_back({start, local, length});
      }
      local += length;
    }
  }
  return runs;
}

}  // namespace shardwise::tensor_parallel
