// Device-independent bodies of the sharding ops: argument checks and copy plans. Each device
// passes its executor (copy_runs_cpu, or the CUDA launcher with the runs moved to the device).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <functional>
#include <optional>
#include <vector>

#include "sharding/copy_runs.h"

namespace shardwise::sharding {

using Executor = std::function<void(const std::vector<CopyRun>& runs,
                                    const CopyRunsOptions& options,
                                    const at::Tensor& on_device_of)>;

at::Tensor all_gather_copy_in_impl(at::TensorList shards,
                                   at::IntArrayRef numels,
                                   int64_t world_size,
                                   int64_t rank,
                                   at::ScalarType dtype,
                                   const Executor& execute);

std::vector<at::Tensor> all_gather_copy_out_impl(const at::Tensor& gathered,
                                                 at::IntArrayRef numels,
                                                 int64_t world_size,
                                                 const Executor& execute);

void all_gather_copy_out_into_impl(const at::Tensor& gathered,
                                   at::IntArrayRef numels,
                                   int64_t world_size,
                                   at::TensorList params,
                                   const Executor& execute);

at::Tensor reduce_scatter_copy_in_impl(const c10::List<std::optional<at::Tensor>>& grads,
                                       at::IntArrayRef numels,
                                       int64_t world_size,
                                       at::ScalarType dtype,
                                       double scale,
                                       const Executor& execute);

void reduce_scatter_copy_in_into_impl(const c10::List<std::optional<at::Tensor>>& grads,
                                      at::IntArrayRef numels,
                                      int64_t world_size,
                                      double scale,
                                      const at::Tensor& buffer,
                                      const Executor& execute);

std::vector<at::Tensor> reduce_scatter_copy_out_impl(const at::Tensor& reduced,
                                                     at::IntArrayRef numels,
                                                     int64_t world_size,
                                                     int64_t rank,
                                                     at::ScalarType dtype,
                                                     double scale,
                                                     const Executor& execute);

void reduce_scatter_copy_out_acc_impl(const at::Tensor& reduced,
                                      at::IntArrayRef numels,
                                      int64_t world_size,
                                      int64_t rank,
                                      double scale,
                                      at::TensorList shard_grads,
                                      bool accumulate,
                                      const Executor& execute);

using ExecutorFn = void (*)(const std::vector<CopyRun>& runs,
                            const CopyRunsOptions& options,
                            const at::Tensor& on_device_of);

// Registers every sharding op for one device, with that device's executor (shard_ops.cpp: CPU,
// shard_ops_cuda.cpp: CUDA).
template <ExecutorFn kExecute>
void register_sharding_impls(torch::Library& m) {
  m.impl("all_gather_copy_in", [](at::TensorList shards, at::IntArrayRef numels, int64_t world,
                                  int64_t rank, at::ScalarType dtype) {
    return all_gather_copy_in_impl(shards, numels, world, rank, dtype, kExecute);
  });
  m.impl("all_gather_copy_out",
         [](const at::Tensor& gathered, at::IntArrayRef numels, int64_t world) {
           return all_gather_copy_out_impl(gathered, numels, world, kExecute);
         });
  m.impl("all_gather_copy_out_", [](const at::Tensor& gathered, at::IntArrayRef numels,
                                    int64_t world, at::TensorList params) {
    all_gather_copy_out_into_impl(gathered, numels, world, params, kExecute);
  });
  m.impl("reduce_scatter_copy_in",
         [](const c10::List<std::optional<at::Tensor>>& grads, at::IntArrayRef numels,
            int64_t world, at::ScalarType dtype, double scale) {
           return reduce_scatter_copy_in_impl(grads, numels, world, dtype, scale, kExecute);
         });
  m.impl("reduce_scatter_copy_in_",
         [](const c10::List<std::optional<at::Tensor>>& grads, at::IntArrayRef numels,
            int64_t world, double scale, const at::Tensor& buffer) {
           reduce_scatter_copy_in_into_impl(grads, numels, world, scale, buffer, kExecute);
         });
  m.impl("reduce_scatter_copy_out", [](const at::Tensor& reduced, at::IntArrayRef numels,
                                       int64_t world, int64_t rank, at::ScalarType dtype,
                                       double scale) {
    return reduce_scatter_copy_out_impl(reduced, numels, world, rank, dtype, scale, kExecute);
  });
  m.impl("reduce_scatter_copy_out_",
         [](const at::Tensor& reduced, at::IntArrayRef numels, int64_t world, int64_t rank,
            double scale, at::TensorList grads, bool accumulate) {
           reduce_scatter_copy_out_acc_impl(reduced, numels, world, rank, scale, grads, accumulate,
                                            kExecute);
         });
}

}  // namespace shardwise::sharding
