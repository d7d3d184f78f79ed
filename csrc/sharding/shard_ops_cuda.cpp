// CUDA implementations of the sharding ops: the plans are built on the host, the runs and their
// tiles copied to the device on the current stream, and one launch of copy_runs_cuda executes them.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstring>

#include "sharding/copy_tiles.h"
#include "sharding/shard_ops_impl.h"

namespace shardwise::sharding {
namespace {

// The runs and their tile starts (copy_tiles.h) travel to the device in one pinned buffer.
void execute_cuda(const std::vector<CopyRun>& runs,
                  const CopyRunsOptions& options,
                  const at::Tensor& on_device_of) {
  if (runs.empty()) return;
  const c10::cuda::CUDAGuard guard(on_device_of.device());
  const auto count = static_cast<int64_t>(runs.size());
  const std::vector<int64_t> starts = tile_starts_of(runs.data(), count);
  const size_t run_bytes = runs.size() * sizeof(CopyRun);  // a multiple of 8: starts stay aligned
  const size_t start_bytes = starts.size() * sizeof(int64_t);
  static_assert(sizeof(CopyRun) % alignof(int64_t) == 0);
  at::Tensor host = at::empty({static_cast<int64_t>(run_bytes + start_bytes)},
                              at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  auto* bytes = static_cast<char*>(host.mutable_data_ptr());
  std::memcpy(bytes, runs.data(), run_bytes);
  std::memcpy(bytes + run_bytes, starts.data(), start_bytes);
  // The pinned host copy stays alive until the copy has run: the caching host allocator records
  // the stream use of a non_blocking copy.
  const at::Tensor device = host.to(on_device_of.device(), /*non_blocking=*/true);
  const auto* device_bytes = static_cast<const char*>(device.const_data_ptr());
  copy_runs_cuda(reinterpret_cast<const CopyRun*>(device_bytes),
                 reinterpret_cast<const int64_t*>(device_bytes + run_bytes), count, starts.back(),
                 options, static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
}

TORCH_LIBRARY_IMPL(shardwise, CUDA, m) { register_sharding_impls<execute_cuda>(m); }

}  // namespace
}  // namespace shardwise::sharding
