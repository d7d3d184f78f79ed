// CUDA implementations of the sharding ops: the plans are built on the host, the runs copied to
// the device on the current stream, and one launch of copy_runs_cuda executes them.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "sharding/shard_ops_impl.h"

namespace shardwise::sharding {
namespace {

void execute_cuda(const std::vector<CopyRun>& runs,
                  const CopyRunsOptions& options,
                  const at::Tensor& on_device_of) {
  if (runs.empty()) return;
  const c10::cuda::CUDAGuard guard(on_device_of.device());
  const int64_t bytes = static_cast<int64_t>(runs.size() * sizeof(CopyRun));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.mutable_data_ptr(), runs.data(), bytes);
  // The pinned host copy stays alive until the copy has run: the caching host allocator records
  // the stream use of a non_blocking copy.
  at::Tensor device = host.to(on_device_of.device(), /*non_blocking=*/true);
  int64_t longest = 0;
  for (const CopyRun& run : runs) longest = std::max(longest, run.count);
  copy_runs_cuda(static_cast<const CopyRun*>(device.const_data_ptr()),
                 static_cast<int64_t>(runs.size()), longest, options,
                 static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
}

TORCH_LIBRARY_IMPL(shardwise, CUDA, m) { register_sharding_impls<execute_cuda>(m); }

}  // namespace
}  // namespace shardwise::sharding
