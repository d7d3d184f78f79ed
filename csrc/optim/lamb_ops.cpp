// LAMB's two passes as ops on the CPU (spans shared between threads by at::parallel_for) and
// the C++ API of lamb_ops.h, which runs them around the per-parameter reduction.
#include "optim/lamb_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "optim/fused_optim_impl.h"

namespace shardwise::optim {
namespace {

at::Tensor lamb_moments_cpu_op(at::TensorList params,
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
  at::Tensor squares = at::zeros({static_cast<int64_t>(spans.size()), 2}, at::kDouble);
  double* sums = squares.mutable_data_ptr<double>();
  at::parallel_for(0, static_cast<int64_t>(spans.size()), 1, [&](int64_t begin, int64_t end) {
    lamb_moments_cpu(spans.data() + begin, end - begin, scalars, sums + 2 * begin);
  });
  return squares;
}

void lamb_apply_cpu_op(at::TensorList params,
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
  // the gradient is not read by this pass: the parameters stand in for it in the checks
  const auto spans = adamw_spans({params, params, exp_avgs, exp_avg_sqs, low_precision}, op);
  TORCH_CHECK_VALUE(scaled_steps.scalar_type() == at::kFloat && scaled_steps.dim() == 1 &&
                        scaled_steps.numel() == static_cast<int64_t>(spans.size()),
                    op, ": scaled_steps must be a float32 vector of one value per parameter (",
                    spans.size(), "), got ", scaled_steps.scalar_type(), " of shape ",
                    scaled_steps.sizes());
  const at::Tensor steps = scaled_steps.contiguous();
  const float* per_span = steps.const_data_ptr<float>();
  at::parallel_for(0, static_cast<int64_t>(spans.size()), 1, [&](int64_t begin, int64_t end) {
    lamb_apply_cpu(spans.data() + begin, end - begin, scalars, per_span + begin);
  });
}

TORCH_LIBRARY_IMPL(shardwise, CPU, m) {
  m.impl("fused_lamb_moments_", &lamb_moments_cpu_op);
  m.impl("fused_lamb_apply_", &lamb_apply_cpu_op);
}

}  // namespace
}  // namespace shardwise::optim

namespace shardwise {

at::Tensor fused_lamb_(at::TensorList params,
                       at::TensorList grads,
                       at::TensorList exp_avgs,
                       at::TensorList exp_avg_sqs,
                       at::TensorList low_precision,
                       const optim::LambOptions& o,
                       const std::vector<int64_t>& param_of,
                       const std::function<void(at::Tensor&)>& reduce) {
  const int64_t spans = static_cast<int64_t>(params.size());
  TORCH_CHECK_VALUE(param_of.empty() || static_cast<int64_t>(param_of.size()) == spans,
                    "fused_lamb_: param_of has ", param_of.size(), " entries for ", spans,
                    " tensors; give one per tensor, or none");
  const optim::LambScalars scalars = optim::checked_lamb_scalars(o, "fused_lamb_");
  static auto moments =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("shardwise::fused_lamb_moments_", "")
          .typed<at::Tensor(at::TensorList, at::TensorList, at::TensorList, at::TensorList, double,
                            double, double, double, bool, double)>();
  const at::Tensor squares = moments
                                 .call(params, grads, exp_avgs, exp_avg_sqs, o.beta1, o.beta2,
                                       o.eps, o.weight_decay, o.eps_inside_sqrt, o.grad_scale)
                                 .cpu();
  int64_t count = spans;
  at::Tensor index = at::arange(spans, at::kLong);
  if (!param_of.empty()) {
    index = at::tensor(param_of, at::kLong);
    count = spans == 0 ? 0 : index.max().item<int64_t>() + 1;
  }
  at::Tensor per_param = at::zeros({count, 2}, at::kDouble).index_add_(0, index, squares);
  if (reduce) {  // on the parameters' device, where their group's collectives run
    per_param = per_param.to(params.empty() ? at::kCPU : params[0].device());
    reduce(per_param);
    per_param = per_param.cpu();
  }
  at::Tensor coefficients = at::empty({count}, at::kDouble);
  const double* sums = per_param.const_data_ptr<double>();
  for (int64_t p = 0; p < count; ++p) {
    coefficients.mutable_data_ptr<double>()[p] =
        optim::lamb_coefficient(sums[2 * p], sums[2 * p + 1], o);
  }
  const at::Tensor scaled_steps = (coefficients.index_select(0, index) * scalars.step_size)
                                      .to(at::kFloat)
                                      .to(params.empty() ? at::kCPU : params[0].device());
  static auto apply =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("shardwise::fused_lamb_apply_", "")
          .typed<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                      const at::Tensor&, double, double, double, double, bool)>();
  apply.call(params, exp_avgs, exp_avg_sqs, low_precision, scaled_steps, o.beta1, o.beta2, o.eps,
             o.weight_decay, o.eps_inside_sqrt);
  return coefficients;
}

}  // namespace shardwise
