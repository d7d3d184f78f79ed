// Data-parallel gradient averaging of replicated parameters, once per step: the defined
// gradients are packed into one flat buffer, summed over `group` in one all-reduce, divided by
// the group's size and copied back.
#pragma once

#include <ATen/core/Tensor.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

namespace shardwise::distributed {

// Parameters without a gradient are left out (every replica must agree on which have one).
// Gradients of several dtypes or devices are averaged in one all-reduce per (dtype, device).
void average_gradients(const std::vector<at::Tensor>& parameters, c10d::ProcessGroup& group);

}  // namespace shardwise::distributed
