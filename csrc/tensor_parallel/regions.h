// Tensor-parallel communication regions (Megatron's f/g operators) as C++ autograd functions over
// any c10d process group (the shardwise backend, gloo, NCCL). Each does one collective forward
// and its conjugate backward:
//
//   copy_to_region          identity          | all-reduce(grad)     ("f": enters a TP region)
//   reduce_from_region      all-reduce         | identity             ("g": leaves a TP region)
//   gather_along            all-gather on dim  | reduce-scatter on dim (sequence -> full)
//   reduce_scatter_along    reduce-scatter dim | all-gather on dim    (partial full -> sequence)
//   scatter_along           keep own slice     | all-gather on dim    (replicated -> sequence)
//
// The plain collectives below them (all_gather_dim, reduce_scatter_dim) lay a dimension other
// than 0 out rank-major and back, so a sequence dimension 1 ([batch, seq, hidden]) works.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace shardwise::tensor_parallel {

using Group = c10::intrusive_ptr<c10d::ProcessGroup>;

// Plain collectives (no autograd). `work` variants start the collective and return the Work to
// wait on with the buffer that will hold the result.
at::Tensor all_reduce_sum(const at::Tensor& input, const Group& group);
at::Tensor all_reduce_max(const at::Tensor& input, const Group& group);
at::Tensor all_gather_dim(const at::Tensor& input, int64_t dim, const Group& group);
at::Tensor reduce_scatter_dim(const at::Tensor& input, int64_t dim, const Group& group);

struct Pending {  // a started collective: wait() returns its result
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor result;
  std::function<at::Tensor(const at::Tensor&)> finish;  // applied to `result` after the wait
  at::Tensor wait();
};
Pending all_reduce_sum_async(at::Tensor buffer, const Group& group);  // in place on `buffer`
Pending all_gather_dim_async(const at::Tensor& input, int64_t dim, const Group& group);
Pending reduce_scatter_dim_async(const at::Tensor& input, int64_t dim, const Group& group);

// Keeps `group` in an autograd context (as a capsule) and gets it back in backward.
void save_group(torch::autograd::AutogradContext* ctx, const Group& group);
Group load_group(torch::autograd::AutogradContext* ctx);

// The autograd regions.
at::Tensor copy_to_region(const at::Tensor& input, const Group& group);
at::Tensor reduce_from_region(const at::Tensor& input, const Group& group);
at::Tensor gather_along(const at::Tensor& input, int64_t dim, const Group& group);
at::Tensor reduce_scatter_along(const at::Tensor& input, int64_t dim, const Group& group);
at::Tensor scatter_along(const at::Tensor& input, int64_t dim, const Group& group);

}  // namespace shardwise::tensor_parallel
