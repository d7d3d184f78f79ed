// One rank's parameters and buffers on every rank of a group (DDP's and FSDP's
// sync_module_states): one broadcast per dtype, the tensors packed into one buffer.
#pragma once

#include <torch/nn/module.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

namespace shardwise::distributed {

void broadcast_module(torch::nn::Module& module, c10d::ProcessGroup& group, int root = 0);
// The same for a list of tensors (each once, however often it is listed).
void broadcast_tensors(const std::vector<at::Tensor>& tensors,
                       c10d::ProcessGroup& group,
                       int root = 0);

}  // namespace shardwise::distributed
