#include "sharding/shard_plans.h"

#include <stdexcept>
#include <string>

namespace shardwise::sharding {
namespace {

const char* at(const void* base, int64_t element, size_t bytes) {
  return static_cast<const char*>(base) + element * static_cast<int64_t>(bytes);
}

char* at(void* base, int64_t element, size_t bytes) {
  return static_cast<char*>(base) + element * static_cast<int64_t>(bytes);
}

void check_count(const FlatLayout& layout, size_t given, const char* what) {
  if (given != static_cast<size_t>(layout.num_params())) {
    throw std::invalid_argument(std::string(what) + ": got " + std::to_string(given) +
                                " pointers for a layout of " + std::to_string(layout.num_params()) +
                                " parameters");
  }
}

}  // namespace

std::vector<CopyRun> plan_all_gather_copy_in(const FlatLayout& layout,
                                             int rank,
                                             const std::vector<const void*>& shards,
                                             void* shard,
                                             const PlanBuffers& sizes) {
  check_count(layout, shards.size(), "plan_all_gather_copy_in");
  std::vector<CopyRun> runs;
  runs.reserve(2 * shards.size());
  for (int64_t i = 0; i < layout.num_params(); ++i) {
    const int64_t valid = layout.valid(i, rank);
    char* piece = at(shard, layout.offset(i), sizes.dst_bytes);
    runs.push_back({shards[i], piece, valid});
    runs.push_back({nullptr, at(piece, valid, sizes.dst_bytes), layout.chunk(i) - valid});
  }
  return runs;
}

std::vector<CopyRun> plan_all_gather_copy_out(const FlatLayout& layout,
                                              const void* gathered,
                                              const std::vector<void*>& params,
                                              const PlanBuffers& sizes) {
  check_count(layout, params.size(), "plan_all_gather_copy_out");
  std::vector<CopyRun> runs;
  runs.reserve(params.size() * layout.world_size());
  for (int64_t i = 0; i < layout.num_params(); ++i) {
    for (int r = 0; r < layout.world_size(); ++r) {
      const int64_t valid = layout.valid(i, r);
      if (valid == 0) break;  // later ranks hold only padding of this parameter
      const int64_t source = r * layout.shard_numel() + layout.offset(i);
      runs.push_back({at(gathered, source, sizes.src_bytes),
                      at(params[i], layout.start(i, r), sizes.dst_bytes), valid});
    }
  }
  return runs;
}

std::vector<CopyRun> plan_reduce_scatter_copy_in(const FlatLayout& layout,
                                                 const std::vector<const void*>& grads,
                                                 void* buffer,
                                                 const PlanBuffers& sizes) {
  check_count(layout, grads.size(), "plan_reduce_scatter_copy_in");
  std::vector<CopyRun> runs;
  runs.reserve(2 * grads.size() * layout.world_size());
  for (int r = 0; r < layout.world_size(); ++r) {
    for (int64_t i = 0; i < layout.num_params(); ++i) {  // rank-major: block r in order
      const int64_t valid = layout.valid(i, r);
      char* piece = at(buffer, r * layout.shard_numel() + layout.offset(i), sizes.dst_bytes);
      const void* source =
          grads[i] == nullptr ? nullptr : at(grads[i], layout.start(i, r), sizes.src_bytes);
      runs.push_back({source, piece, valid});
      runs.push_back({nullptr, at(piece, valid, sizes.dst_bytes), layout.chunk(i) - valid});
    }
  }
  return runs;
}

std::vector<CopyRun> plan_reduce_scatter_copy_out(const FlatLayout& layout,
                                                  int rank,
                                                  const void* reduced,
                                                  const std::vector<void*>& shard_grads,
                                                  const PlanBuffers& sizes) {
  check_count(layout, shard_grads.size(), "plan_reduce_scatter_copy_out");
  std::vector<CopyRun> runs;
  runs.reserve(shard_grads.size());
  for (int64_t i = 0; i < layout.num_params(); ++i) {
    if (shard_grads[i] == nullptr) continue;
    runs.push_back(
        {at(reduced, layout.offset(i), sizes.src_bytes), shard_grads[i], layout.valid(i, rank)});
  }
  return runs;
}

}  // namespace shardwise::sharding
