// Argument checks of the fused optimizer ops and the spans over the checked tensors. Every error
// names the op, the argument (with its index) and what to pass instead, and is raised before any
// tensor is written.
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "optim/fused_optim_impl.h"

namespace shardwise::optim {
namespace {

std::string item(const char* list, size_t i) {
  return std::string(list) + "[" + std::to_string(i) + "]";
}

Format format_of(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? Format::kBFloat16
                                : (dtype == at::kHalf ? Format::kFloat16 : Format::kFloat32);
}

void check_length(const char* op, const char* name, at::TensorList list, at::TensorList params) {
  TORCH_CHECK_VALUE(list.size() == params.size(), op, ": ", name, " has ", list.size(),
                    " tensors but params has ", params.size(), "; pass one per parameter");
}

// numel, device and layout against params[i].
void check_like_param(const char* op,
                      const std::string& what,
                      const at::Tensor& t,
                      const at::Tensor& param) {
  TORCH_CHECK_VALUE(t.numel() == param.numel(), op, ": ", what, " has ", t.numel(),
                    " elements but its parameter has ", param.numel(),
                    "; pass tensors with the parameter's number of elements");
  TORCH_CHECK_VALUE(t.device() == param.device(), op, ": ", what, " is on ", t.device(),
                    " but its parameter is on ", param.device(), "; move it to ", param.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", what,
                    " is not contiguous; pass contiguous tensors (e.g. flat partitions)");
}

void check_float32(const char* op, const std::string& what, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, op, ": ", what, " has dtype ", t.scalar_type(),
                   "; it must be float32 (keep float32 master parameters and state, and pass a "
                   "bfloat16/float16 copy in low_precision)");
}

void check_params(const char* op, at::TensorList params) {
  for (size_t i = 0; i < params.size(); ++i) {
    check_float32(op, item("params", i), params[i]);
    TORCH_CHECK_VALUE(params[i].is_contiguous(), op, ": ", item("params", i),
                      " is not contiguous; pass contiguous tensors (e.g. flat partitions)");
    TORCH_CHECK_VALUE(params[i].device() == params[0].device(), op, ": ", item("params", i),
                      " is on ", params[i].device(), " but params[0] is on ", params[0].device(),
                      "; call the op once per device");
  }
}

// grads: float32, bfloat16 or float16, one dtype for the whole list.
void check_grads(const char* op, at::TensorList grads, at::TensorList params) {
  check_length(op, "grads", grads, params);
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::ScalarType dtype = grads[i].scalar_type();
    TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op, ": ",
                     item("grads", i), " has dtype ", dtype,
                     "; gradients must be float32, bfloat16 or float16");
    TORCH_CHECK_TYPE(dtype == grads[0].scalar_type(), op, ": ", item("grads", i), " has dtype ",
                     dtype, " but grads[0] has ", grads[0].scalar_type(),
                     "; pass gradients of one dtype per call");
    check_like_param(op, item("grads", i), grads[i], params[i]);
  }
}

void check_state(const char* op, const char* name, at::TensorList state, at::TensorList params) {
  check_length(op, name, state, params);
  for (size_t i = 0; i < state.size(); ++i) {
    check_float32(op, item(name, i), state[i]);
    check_like_param(op, item(name, i), state[i], params[i]);
  }
}

// low_precision: empty, or bfloat16/float16, one dtype for the whole list.
void check_low_precision(const char* op, at::TensorList low, at::TensorList params) {
  if (low.empty()) return;
  TORCH_CHECK_VALUE(low.size() == params.size(), op, ": low_precision has ", low.size(),
                    " tensors but params has ", params.size(),
                    "; pass one per parameter, or an empty list for no low-precision copy");
  for (size_t i = 0; i < low.size(); ++i) {
    const at::ScalarType dtype = low[i].scalar_type();
    TORCH_CHECK_TYPE(dtype == at::kBFloat16 || dtype == at::kHalf, op, ": ",
                     item("low_precision", i), " has dtype ", dtype,
                     "; the low-precision copy must be bfloat16 or float16");
    TORCH_CHECK_TYPE(dtype == low[0].scalar_type(), op, ": ", item("low_precision", i),
                     " has dtype ", dtype, " but low_precision[0] has ", low[0].scalar_type(),
                     "; pass copies of one dtype per call");
    check_like_param(op, item("low_precision", i), low[i], params[i]);
  }
}

void check_nonnegative(const char* op, const char* name, double value) {
  TORCH_CHECK_VALUE(value >= 0.0, op, ": ", name, " must be >= 0, got ", value);
}

}  // namespace

AdamWOptions checked_adamw_options(double lr,
                                   double beta1,
                                   double beta2,
                                   double eps,
                                   double weight_decay,
                                   int64_t step,
                                   double grad_scale) {
  const char* op = "shardwise.fused_adamw_";
  check_nonnegative(op, "lr", lr);
  check_nonnegative(op, "eps", eps);
  check_nonnegative(op, "weight_decay", weight_decay);
  TORCH_CHECK_VALUE(beta1 >= 0.0 && beta1 < 1.0, op, ": beta1 must be in [0, 1), got ", beta1);
  TORCH_CHECK_VALUE(beta2 >= 0.0 && beta2 < 1.0, op, ": beta2 must be in [0, 1), got ", beta2);
  TORCH_CHECK_VALUE(step >= 1, op, ": step must be >= 1 (count steps from 1, incrementing before ",
                    "each call as torch.optim does), got ", step);
  return {lr, beta1, beta2, eps, weight_decay, step, grad_scale};
}

SgdOptions checked_sgd_options(double lr,
                               double momentum,
                               double dampening,
                               double weight_decay,
                               bool nesterov,
                               bool first_step,
                               double grad_scale) {
  const char* op = "shardwise.fused_sgd_";
  check_nonnegative(op, "lr", lr);
  check_nonnegative(op, "momentum", momentum);
  check_nonnegative(op, "weight_decay", weight_decay);
  TORCH_CHECK_VALUE(!nesterov || (momentum > 0.0 && dampening == 0.0), op,
                    ": nesterov needs momentum > 0 and dampening == 0 (as torch.optim.SGD)");
  return {lr, momentum, dampening, weight_decay, nesterov, first_step, grad_scale};
}

std::vector<AdamWSpan> adamw_spans(const AdamWTensors& t, const char* op) {
  check_params(op, t.params);
  check_grads(op, t.grads, t.params);
  check_state(op, "exp_avgs", t.exp_avgs, t.params);
  check_state(op, "exp_avg_sqs", t.exp_avg_sqs, t.params);
  check_low_precision(op, t.low_precision, t.params);
  std::vector<AdamWSpan> spans;
  for (size_t i = 0; i < t.params.size(); ++i) {
    AdamWSpan span;
    span.param = t.params[i].mutable_data_ptr<float>();
    span.grad = t.grads[i].const_data_ptr();
    span.grad_format = format_of(t.grads[i].scalar_type());
    span.exp_avg = t.exp_avgs[i].mutable_data_ptr<float>();
    span.exp_avg_sq = t.exp_avg_sqs[i].mutable_data_ptr<float>();
    if (!t.low_precision.empty()) {
      span.low_precision = t.low_precision[i].mutable_data_ptr();
      span.low_precision_format = format_of(t.low_precision[i].scalar_type());
    }
    span.count = t.params[i].numel();
    spans.push_back(span);
  }
  return spans;
}

std::vector<SgdSpan> sgd_spans(const SgdTensors& t, const SgdOptions& options) {
  const char* op = "shardwise.fused_sgd_";
  check_params(op, t.params);
  check_grads(op, t.grads, t.params);
  const bool use_momentum = options.momentum != 0.0;
  TORCH_CHECK_VALUE(use_momentum || t.momentum_buffers.empty(), op,
                    ": momentum is 0, so momentum_buffers must be an empty list");
  if (use_momentum) check_state(op, "momentum_buffers", t.momentum_buffers, t.params);
  check_low_precision(op, t.low_precision, t.params);
  std::vector<SgdSpan> spans;
  for (size_t i = 0; i < t.params.size(); ++i) {
    SgdSpan span;
    span.param = t.params[i].mutable_data_ptr<float>();
    span.grad = t.grads[i].const_data_ptr();
    span.grad_format = format_of(t.grads[i].scalar_type());
    if (use_momentum) span.momentum_buffer = t.momentum_buffers[i].mutable_data_ptr<float>();
    if (!t.low_precision.empty()) {
      span.low_precision = t.low_precision[i].mutable_data_ptr();
      span.low_precision_format = format_of(t.low_precision[i].scalar_type());
    }
    span.count = t.params[i].numel();
    spans.push_back(span);
  }
  return spans;
}

// lamb_scalars with its errors as torch's ValueError, naming the op.
LambScalars checked_lamb_scalars(const LambOptions& options, const char* op) {
  TORCH_CHECK_VALUE(options.lr >= 0.0, op, ": lr must be >= 0, got ", options.lr);
  TORCH_CHECK_VALUE(options.weight_decay >= 0.0, op, ": weight_decay must be >= 0, got ",
                    options.weight_decay);
  std::string problem;
  try {
    return lamb_scalars(options);
  } catch (const std::invalid_argument& error) {
    problem = error.what();
  }
  TORCH_CHECK_VALUE(false, op, ": ", problem);
  return {};
}

LambOptions lamb_direction_options(double beta1,
                                   double beta2,
                                   double eps,
                                   double weight_decay,
                                   bool eps_inside_sqrt,
                                   double grad_scale) {
  LambOptions o;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.eps = eps;
  o.weight_decay = weight_decay;
  o.eps_inside_sqrt = eps_inside_sqrt;
  o.grad_scale = grad_scale;
  return o;
}

}  // namespace shardwise::optim
