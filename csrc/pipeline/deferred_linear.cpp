#include "pipeline/deferred_linear.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace shardwise::pipeline {
namespace {

thread_local WeightGradStore* tls_store = nullptr;

// Adds `grad` to `param.grad` (created on first use) in the parameter's dtype.
void accumulate(const at::Tensor& param, const at::Tensor& grad) {
  at::Tensor& slot = const_cast<at::Tensor&>(param).mutable_grad();
  if (!slot.defined()) {
    slot = grad.to(param.scalar_type()).contiguous();
  } else {
    slot.add_(grad);
  }
}

// weight_grad = grad_output^T · input and bias_grad = sum(grad_output) over all leading
// dimensions, in the dtype the forward computed in.
std::pair<at::Tensor, at::Tensor> weight_gradients(const at::Tensor& grad_output,
                                                   const at::Tensor& input,
                                                   bool with_bias) {
  const at::Tensor g = grad_output.reshape({-1, grad_output.size(-1)});
  const at::Tensor x = input.reshape({-1, input.size(-1)});
  return {g.t().mm(x), with_bias ? g.sum(0) : at::Tensor()};
}

struct DeferredLinearFn : public torch::autograd::Function<DeferredLinearFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const at::Tensor& input,
                            const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_or_none) {
    const at::Tensor bias = bias_or_none.value_or(at::Tensor());
    at::Tensor x = input, w = weight, b = bias;
    const auto device = input.device().type();
    if (at::autocast::is_autocast_enabled(device)) {  // compute as autocast's linear would
      const auto dtype = at::autocast::get_autocast_dtype(device);
      x = input.to(dtype), w = weight.to(dtype);
      if (b.defined()) b = bias.to(dtype);
    }
    ctx->save_for_backward({x, w});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["bias"] = bias;
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(input.scalar_type());
    if (WeightGradStore* store = WeightGradStore::current()) {
      ctx->saved_data["store"] = at::IValue::make_capsule(
          c10::intrusive_ptr<torch::CustomClassHolder>::reclaim_copy(store));
    }
    return at::linear(x, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();
    const at::Tensor bias = ctx->saved_data["bias"].toTensor();
    const at::Tensor g = grads[0].to(x.scalar_type());
    const auto input_dtype = static_cast<at::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    at::Tensor grad_input = g.matmul(w).to(input_dtype);
    WeightGradStore* store = nullptr;
    if (auto it = ctx->saved_data.find("store"); it != ctx->saved_data.end()) {
      store = static_cast<WeightGradStore*>(it->second.toCapsule().get());
    }
    if (store != nullptr && store->deferring()) {
      const bool needs_weight = weight.requires_grad();
      const bool needs_bias = bias.defined() && bias.requires_grad();
      store->push([g, x, weight, bias, needs_weight, needs_bias] {
        auto [grad_weight, grad_bias] = weight_gradients(g, x, needs_bias);
        if (needs_weight) accumulate(weight, grad_weight);
        if (needs_bias) accumulate(bias, grad_bias);
      });
      return {grad_input, at::Tensor(), at::Tensor()};
    }
    auto [grad_weight, grad_bias] = weight_gradients(g, x, bias.defined());
    return {grad_input, grad_weight.to(weight.scalar_type()),
            bias.defined() ? grad_bias.to(bias.scalar_type()) : at::Tensor()};
  }
};

}  // namespace

WeightGradStore::Capture::Capture(WeightGradStore* store) : previous_(tls_store) {
  tls_store = store;
}

WeightGradStore::Capture::~Capture() { tls_store = previous_; }

WeightGradStore* WeightGradStore::current() { return tls_store; }

void WeightGradStore::push(std::function<void()> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(std::move(work));
}

std::vector<std::function<void()>> WeightGradStore::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(queue_, {});
}

at::Tensor deferred_linear(const at::Tensor& input,
                           const at::Tensor& weight,
                           const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(-1) == weight.size(-1),
                    "deferred_linear: input ", input.sizes(), " does not match weight ",
                    weight.sizes(), " (the last dimension of input must be in_features)");
  return DeferredLinearFn::apply(input, weight, bias);
}

}  // namespace shardwise::pipeline
