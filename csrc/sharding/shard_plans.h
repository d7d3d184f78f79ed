// The four sharding copies as lists of copy runs over a FlatLayout (see flat_layout.h for the
// buffer layout). Sizes in bytes of one element are passed for source and destination so the same
// plan serves every element type; the runs are then executed by copy_runs_cpu / copy_runs_cuda
// with the conversion, scale and accumulation of the caller's choice.
//
//   all-gather copy-in:       rank's piece of each parameter  -> its shard (padding zeroed)
//   all-gather copy-out:      gathered buffer (world shards)  -> each full parameter
//   reduce-scatter copy-in:   each full gradient (or zeros)   -> buffer of world shards
//   reduce-scatter copy-out:  reduced shard                   -> each parameter's sharded grad
#pragma once

#include <vector>

#include "sharding/copy_runs.h"
#include "sharding/flat_layout.h"

namespace shardwise::sharding {

struct PlanBuffers {
  size_t src_bytes = 4;  // bytes per element of the source
  size_t dst_bytes = 4;  // bytes per element of the destination
};

// `shards[i]` holds layout.valid(i, rank) elements; `shard` receives shard_numel() elements.
std::vector<CopyRun> plan_all_gather_copy_in(const FlatLayout& layout,
                                             int rank,
                                             const std::vector<const void*>& shards,
                                             void* shard,
                                             const PlanBuffers& sizes);

// `gathered` holds total_numel() elements; `params[i]` receives numel(i) elements.
std::vector<CopyRun> plan_all_gather_copy_out(const FlatLayout& layout,
                                              const void* gathered,
                                              const std::vector<void*>& params,
                                              const PlanBuffers& sizes);

// `grads[i]` holds numel(i) elements, or is null for a parameter without a gradient (zeros are
// sent); `buffer` receives total_numel() elements.
std::vector<CopyRun> plan_reduce_scatter_copy_in(const FlatLayout& layout,
                                                 const std::vector<const void*>& grads,
                                                 void* buffer,
                                                 const PlanBuffers& sizes);

// `reduced` holds shard_numel() elements of `rank`; `shard_grads[i]` receives valid(i, rank)
// elements, or is null to skip parameter i.
std::vector<CopyRun> plan_reduce_scatter_copy_out(const FlatLayout& layout,
                                                  int rank,
                                                  const void* reduced,
                                                  const std::vector<void*>& shard_grads,
                                                  const PlanBuffers& sizes);

}  // namespace shardwise::sharding
