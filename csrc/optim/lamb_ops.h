// LAMB for LibTorch users (lamb.h's algorithm), through the dispatcher like
// torch.ops.shardwise.fused_lamb_moments_ / fused_lamb_apply_ in Python:
//
//   shardwise::optim::LambOptions options;  // lr, betas, eps, weight_decay, step, coefficients
//   options.step = ++step;
//   auto coefficients = shardwise::fused_lamb_(params, grads, exp_avgs, exp_avg_sqs, {}, options);
//
// Each tensor is a whole parameter, or a piece of one: `param_of[i]` names the parameter that
// span i belongs to (empty: each span its own), and `reduce`, when given, is called on the
// per-parameter sums of squares ([parameters, 2], float64) before the trust ratios are taken,
// to add the other ranks' pieces (an all-reduce over the shard group). Returns each
// parameter's trust ratio (float64), as DeepSpeed's get_lamb_coeffs.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "optim/lamb.h"

namespace shardwise {

at::Tensor fused_lamb_(at::TensorList params,
                       at::TensorList grads,
                       at::TensorList exp_avgs,
                       at::TensorList exp_avg_sqs,
                       at::TensorList low_precision,
                       const optim::LambOptions& options,
                       const std::vector<int64_t>& param_of = {},
                       const std::function<void(at::Tensor&)>& reduce = nullptr);

}  // namespace shardwise
