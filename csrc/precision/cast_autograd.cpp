// Autograd for the casting ops: the gradient of a cast is the reverse cast of the incoming
// gradient, back to the input's dtype (bfloat16/float16 gradients become float32 and vice versa).
// The non-finite flag is not differentiable. multi_cast_ writes into its outputs and has no
// gradient.
#include <torch/autograd.h>
#include <torch/library.h>

#include "precision/cast_ops.h"

namespace shardwise::precision {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor cast_back(AutogradContext* ctx, const at::Tensor& grad) {
  if (!grad.defined()) {
    return grad;
  }
  return shardwise::cast(grad, ctx->saved_data["input_dtype"].toScalarType());
}

struct CastFunction : torch::autograd::Function<CastFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, at::ScalarType dtype) {
    ctx->saved_data["input_dtype"] = input.scalar_type();
    at::AutoDispatchBelowADInplaceOrView guard;
    return shardwise::cast(input, dtype);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {cast_back(ctx, grads[0]), at::Tensor()};
  }
};

struct CastStochasticFunction : torch::autograd::Function<CastStochasticFunction> {
  static at::Tensor forward(AutogradContext* ctx,
                            const at::Tensor& input,
                            int64_t seed,
                            int64_t offset) {
    ctx->saved_data["input_dtype"] = input.scalar_type();
    at::AutoDispatchBelowADInplaceOrView guard;
    return shardwise::cast_stochastic_bf16(input, seed, offset);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {cast_back(ctx, grads[0]), at::Tensor(), at::Tensor()};
  }
};

struct CastCheckFiniteFunction : torch::autograd::Function<CastCheckFiniteFunction> {
  static variable_list forward(AutogradContext* ctx,
                               const at::Tensor& input,
                               at::ScalarType dtype) {
    ctx->saved_data["input_dtype"] = input.scalar_type();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [output, nonfinite] = shardwise::cast_check_finite(input, dtype);
    ctx->mark_non_differentiable({nonfinite});
    return {output, nonfinite};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {cast_back(ctx, grads[0]), at::Tensor()};
  }
};

// Whether a call records a graph node; when not (no grad mode, or an input that needs no
// gradient: every optimizer-side and gathered-weight cast), the op runs below autograd directly
// and skips building the node and its saved data.
bool records_graph(const at::Tensor& input) {
  return at::GradMode::is_enabled() && input.requires_grad();
}

at::Tensor cast_autograd(const at::Tensor& input, at::ScalarType dtype) {
  if (!records_graph(input)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return shardwise::cast(input, dtype);
  }
  return CastFunction::apply(input, dtype);
}

at::Tensor cast_stochastic_autograd(const at::Tensor& input, int64_t seed, int64_t offset) {
  if (!records_graph(input)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return shardwise::cast_stochastic_bf16(input, seed, offset);
  }
  return CastStochasticFunction::apply(input, seed, offset);
}

std::tuple<at::Tensor, at::Tensor> cast_check_finite_autograd(const at::Tensor& input,
                                                              at::ScalarType dtype) {
  if (!records_graph(input)) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return shardwise::cast_check_finite(input, dtype);
  }
  auto outputs = CastCheckFiniteFunction::apply(input, dtype);
  return {outputs[0], outputs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(shardwise, Autograd, m) {
  m.impl("cast", &cast_autograd);
  m.impl("cast_stochastic_bf16", &cast_stochastic_autograd);
  m.impl("cast_check_finite", &cast_check_finite_autograd);
}

}  // namespace shardwise::precision
