// CUDA implementations of the fused optimizer ops: ATen glue around the launchers of
// fused_optim_cuda.cu, queued on the current stream (no synchronisation).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "optim/fused_optim_impl.h"

namespace shardwise::optim {
namespace {

void* current_stream() { return static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()); }

void fused_adamw_cuda_op(at::TensorList params,
                         at::TensorList grads,
                         at::TensorList exp_avgs,
                         at::TensorList exp_avg_sqs,
                         at::TensorList low_precision,
                         double lr,
                         double beta1,
                         double beta2,
                         double eps,
                         double weight_decay,
                         int64_t step,
                         double grad_scale) {
  const AdamWOptions options =
      checked_adamw_options(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
  const auto spans = adamw_spans({params, grads, exp_avgs, exp_avg_sqs, low_precision});
  if (spans.empty()) return;
  const c10::cuda::CUDAGuard guard(params[0].device());
  fused_adamw_cuda(spans.data(), static_cast<int64_t>(spans.size()), adamw_scalars(options),
                   current_stream());
}

void fused_sgd_cuda_op(at::TensorList params,
                       at::TensorList grads,
                       at::TensorList momentum_buffers,
                       at::TensorList low_precision,
                       double lr,
                       double momentum,
                       double dampening,
                       double weight_decay,
                       bool nesterov,
                       bool first_step,
                       double grad_scale) {
  const SgdOptions options =
      checked_sgd_options(lr, momentum, dampening, weight_decay, nesterov, first_step, grad_scale);
  const auto spans = sgd_spans({params, grads, momentum_buffers, low_precision}, options);
  if (spans.empty()) return;
  const c10::cuda::CUDAGuard guard(params[0].device());
  fused_sgd_cuda(spans.data(), static_cast<int64_t>(spans.size()), sgd_scalars(options),
                 current_stream());
}

at::Tensor lamb_moments_cuda_op(at::TensorList params,
                                at::TensorList grads,
                                at::TensorList exp_avgs,
                                at::TensorList exp_avg_sqs,
                                double beta1,
                                double beta2,
                                double eps,
                                double weight_decay,
                                bool eps_inside_sqrt,
                                double grad_scale) {
  const char* op = "shardwise.fused_lamb_moments_";
  const LambScalars scalars = checked_lamb_scalars(
      lamb_direction_options(beta1, beta2, eps, weight_decay, eps_inside_sqrt, grad_scale), op);
  const auto spans = adamw_spans({params, grads, exp_avgs, exp_avg_sqs, {}}, op);
  const int64_t count = static_cast<int64_t>(spans.size());
  const auto options = params[0].options().dtype(at::kDouble);
  at::Tensor squares = at::zeros({count, 2}, options);
  const c10::cuda::CUDAGuard guard(params[0].device());
  at::Tensor partials = at::empty({count * kLambBlocks * 2}, options);
  lamb_moments_cuda(spans.data(), count, scalars, partials.mutable_data_ptr<double>(),
                    squares.mutable_data_ptr<double>(), current_stream());
  return squares;
}

void lamb_apply_cuda_op(at::TensorList params,
                        at::TensorList exp_avgs,
                        at::TensorList exp_avg_sqs,
                        at::TensorList low_precision,
                        const at::Tensor& scaled_steps,
                        double beta1,
                        double beta2,
                        double eps,
                        double weight_decay,
                        bool eps_inside_sqrt) {
  const char* op = "shardwise.fused_lamb_apply_";
  const LambScalars scalars = checked_lamb_scalars(
      lamb_direction_options(beta1, beta2, eps, weight_decay, eps_inside_sqrt, 1.0), op);
  const auto spans = adamw_spans({params, params, exp_avgs, exp_avg_sqs, low_precision}, op);
  TORCH_CHECK_VALUE(scaled_steps.scalar_type() == at::kFloat && scaled_steps.dim() == 1 &&
                        scaled_steps.numel() == static_cast<int64_t>(spans.size()) &&
                        (spans.empty() || scaled_steps.device() == params[0].device()),
                    op, ": scaled_steps must be a float32 vector of one value per parameter (",
                    spans.size(), ") on the parameters' device");
  if (spans.empty()) return;
  const c10::cuda::CUDAGuard guard(params[0].device());
  const at::Tensor steps = scaled_steps.contiguous();
  lamb_apply_cuda(spans.data(), static_cast<int64_t>(spans.size()), scalars,
                  steps.const_data_ptr<float>(), current_stream());
}

}  // namespace

TORCH_LIBRARY_IMPL(shardwise, CUDA, m) {
  m.impl("fused_adamw_", &fused_adamw_cuda_op);
  m.impl("fused_sgd_", &fused_sgd_cuda_op);
  m.impl("fused_lamb_moments_", &lamb_moments_cuda_op);
  m.impl("fused_lamb_apply_", &lamb_apply_cuda_op);
}

}  // namespace shardwise::optim
