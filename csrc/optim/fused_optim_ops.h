// The fused optimizer steps for LibTorch users. Each call goes through the dispatcher, exactly
// like torch.ops.shardwise.fused_adamw_ / fused_sgd_ in Python, so CPU and CUDA tensors both work.
//
//   shardwise::optim::AdamWOptions options;  // lr, beta1, beta2, eps, weight_decay, step, ...
//   options.step = ++step;
//   shardwise::fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*low_precision=*/{}, options);
//
// params (and the optimizer state) are contiguous float32; grads float32, bfloat16 or float16,
// one dtype per call; low_precision is empty or one bfloat16/float16 tensor per parameter that
// receives the updated parameter rounded to nearest even. Arithmetic: optim/optim_math.h.
#pragma once

#include <ATen/core/Tensor.h>

#include "optim/fused_optim.h"

namespace shardwise {

void fused_adamw_(at::TensorList params,
                  at::TensorList grads,
                  at::TensorList exp_avgs,
                  at::TensorList exp_avg_sqs,
                  at::TensorList low_precision,
                  const optim::AdamWOptions& options);

// momentum_buffers may be empty when options.momentum == 0.
void fused_sgd_(at::TensorList params,
                at::TensorList grads,
                at::TensorList momentum_buffers,
                at::TensorList low_precision,
                const optim::SgdOptions& options);

}  // namespace shardwise
