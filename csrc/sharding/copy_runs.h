// The one primitive behind every sharding copy: a list of runs, each copying `count` contiguous
// elements from `src` to `dst` while converting the element type, scaling and optionally
// accumulating (see copy_math.h). A run whose `src` is null fills its destination with zeros
// (padding). The plans in shard_plans.h turn a FlatLayout into runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sharding/copy_math.h"

namespace shardwise::sharding {

struct CopyRun {
  const void* src = nullptr;  // null: write zeros
  void* dst = nullptr;
  int64_t count = 0;
};

struct CopyRunsOptions {
  Element src = Element::kFloat32;
  Element dst = Element::kFloat32;
  double scale = 1.0;       // multiplies every source element
  bool accumulate = false;  // dst += src * scale instead of dst = src * scale
};

size_t element_bytes(Element element);
const char* element_name(Element element);

// Runs every copy on the CPU (vectorized casts where the conversion allows, see cast_kernels.h).
void copy_runs_cpu(const CopyRun* runs, int64_t count, const CopyRunsOptions& options);

// CUDA launcher (compiled only with CUDA): `device_runs` points to `count` runs and
// `device_tile_starts` to their tile_starts (copy_tiles.h, count + 1 entries), both in device
// memory; `tiles` is the total (the host's copy of the last entry); `stream` is a cudaStream_t.
void copy_runs_cuda(const CopyRun* device_runs,
                    const int64_t* device_tile_starts,
                    int64_t count,
                    int64_t tiles,
                    const CopyRunsOptions& options,
                    void* stream);

}  // namespace shardwise::sharding
