// Tensor -> torch-free collective arguments for the backend, with the checks that raise an error
// naming the argument before any communication starts.
#pragma once

#include <ATen/core/Tensor.h>

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "collectives/types.h"

namespace shardwise::backend {

collectives::Datatype datatype_of(const at::Tensor& tensor, const char* op);
collectives::ReduceOp reduce_op_of(const c10d::ReduceOp& op,
                                   const at::Tensor& tensor,
                                   const char* name);

// Errors unless every tensor is a dense CPU tensor.
void check_cpu(const std::vector<at::Tensor>& tensors, const char* op, const char* argument);

// True when every tensor is a dense CUDA tensor (the NCCL path), false when every one is a dense
// CPU tensor; errors on a mix or another device.
bool is_cuda_call(const std::vector<at::Tensor>& tensors, const char* op, const char* argument);

// Runs fn(contiguous) and copies the result back into `tensor` if it was not contiguous.
template <typename Fn>
void with_contiguous(at::Tensor& tensor, Fn fn) {
  at::Tensor staged = tensor.contiguous();
  fn(staged);
  if (!staged.is_same(tensor)) tensor.copy_(staged);
}

}  // namespace shardwise::backend
