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

TORCH_LIBRARY_IMPL(shardwise, CUDA, m) {
  m.impl("all_gather_copy_in", [](at::TensorList shards, at::IntArrayRef numels, int64_t world,
                                  int64_t rank, at::ScalarType dtype) {
    return all_gather_copy_in_impl(shards, numels, world, rank, dtype, execute_cuda);
  });
  m.impl("all_gather_copy_out",
         [](const at::Tensor& gathered, at::IntArrayRef numels, int64_t world) {
           return all_gather_copy_out_impl(gathered, numels, world, execute_cuda);
         });
  m.impl("all_gather_copy_out_", [](const at::Tensor& gathered, at::IntArrayRef numels,
                                    int64_t world, at::TensorList params) {
    all_gather_copy_out_into_impl(gathered, numels, world, params, execute_cuda);
  });
  m.impl("reduce_scatter_copy_in",
         [](const c10::List<std::optional<at::Tensor>>& grads, at::IntArrayRef numels,
            int64_t world, at::ScalarType dtype, double scale) {
           return reduce_scatter_copy_in_impl(grads, numels, world, dtype, scale, execute_cuda);
         });
  m.impl("reduce_scatter_copy_out", [](const at::Tensor& reduced, at::IntArrayRef numels,
                                       int64_t world, int64_t rank, at::ScalarType dtype,
                                       double scale) {
    return reduce_scatter_copy_out_impl(reduced, numels, world, rank, dtype, scale, execute_cuda);
  });
  m.impl("reduce_scatter_copy_out_", [](const at::Tensor& reduced, at::IntArrayRef numels,
                                        int64_t world, int64_t rank, double scale,
                                        at::TensorList grads) {
    reduce_scatter_copy_out_acc_impl(reduced, numels, world, rank, scale, grads, execute_cuda);
  });
}

}  // namespace
}  // namespace shardwise::sharding
