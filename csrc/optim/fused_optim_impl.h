// Device-independent parts of the fused optimizer ops: argument checks (errors name the argument
// and the fix, raised before any work) and the spans over the tensors' data. Each device passes
// the spans to its own kernels (fused_optim_ops.cpp: CPU, fused_optim_ops_cuda.cpp: CUDA).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "optim/fused_optim.h"
#include "optim/lamb.h"

namespace shardwise::optim {

struct AdamWTensors {
  at::TensorList params, grads, exp_avgs, exp_avg_sqs, low_precision;
};

struct SgdTensors {
  at::TensorList params, grads, momentum_buffers, low_precision;
};

// Checked options and spans; the checks cover list lengths, numel, dtype, device and layout.
AdamWOptions checked_adamw_options(double lr,
                                   double beta1,
                                   double beta2,
                                   double eps,
                                   double weight_decay,
                                   int64_t step,
                                   double grad_scale);
SgdOptions checked_sgd_options(double lr,
                               double momentum,
                               double dampening,
                               double weight_decay,
                               bool nesterov,
                               bool first_step,
                               double grad_scale);
// lamb_scalars (lamb.h) with lr and weight_decay checked, its errors as torch's ValueError
// naming `op`.
LambScalars checked_lamb_scalars(const LambOptions& options, const char* op);
// The options LAMB's passes need for the direction (lr, step and the ratio's clamps unused).
LambOptions lamb_direction_options(double beta1,
                                   double beta2,
                                   double eps,
                                   double weight_decay,
                                   bool eps_inside_sqrt,
                                   double grad_scale);
// `op` names the caller in the errors (LAMB's ops check the same tensors).
std::vector<AdamWSpan> adamw_spans(const AdamWTensors& tensors,
                                   const char* op = "shardwise.fused_adamw_");
std::vector<SgdSpan> sgd_spans(const SgdTensors& tensors, const SgdOptions& options);

}  // namespace shardwise::optim
