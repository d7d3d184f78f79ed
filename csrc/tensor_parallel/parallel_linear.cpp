#include "tensor_parallel/parallel_linear.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace shardwise::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dtype at::linear would compute in for `input` under the current autocast state.
std::optional<at::ScalarType> autocast_dtype(const at::Tensor& input) {
  const auto device = input.device().type();
  if (!at::autocast::is_autocast_enabled(device)) return std::nullopt;
  return at::autocast::get_autocast_dtype(device);
}

at::Tensor cast(const at::Tensor& t, std::optional<at::ScalarType> dtype) {
  return dtype && t.defined() ? t.to(*dtype) : t;
}

// grad_weight = grad_output^T · input and grad_bias = sum(grad_output), over all leading dims.
at::Tensor weight_grad(const at::Tensor& grad_output, const at::Tensor& input) {
  return grad_output.reshape({-1, grad_output.size(-1)})
      .t()
      .mm(input.reshape({-1, input.size(-1)}));
}

struct ColumnParallelFn : public torch::autograd::Function<ColumnParallelFn> {
  static at::Tensor forward(AutogradContext* ctx,
                            const at::Tensor& input,
                            const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias_or_none,
                            Group group,
                            bool sequence_parallel,
                            int64_t sequence_dim,
                            bool save_gathered) {
    const at::Tensor bias = bias_or_none.value_or(at::Tensor());
    const auto dtype = autocast_dtype(input);
    const at::Tensor x = cast(input, dtype), w = cast(weight, dtype), b = cast(bias, dtype);
    const at::Tensor full = sequence_parallel ? all_gather_dim(x, sequence_dim, group) : x;
    const bool regather = sequence_parallel && !save_gathered;
    ctx->save_for_backward({regather ? x : full, w});
    ctx->saved_data["regather"] = regather;
    save_group(ctx, group);
    ctx->saved_data["sequence_parallel"] = sequence_parallel;
    ctx->saved_data["sequence_dim"] = sequence_dim;
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(input.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["has_bias"] = bias.defined();
    return at::linear(full, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    const Group group = load_group(ctx);
    const bool sp = ctx->saved_data["sequence_parallel"].toBool();
    const bool regather = ctx->saved_data["regather"].toBool();
    const int64_t dim = ctx->saved_data["sequence_dim"].toInt();
    const auto input_dtype = static_cast<at::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const at::Tensor g = grads[0].to(w.scalar_type());
    // The full input for the weight gradient is gathered again while grad_input is computed
    // (unless it was saved whole).
    Pending gathered =
        regather ? all_gather_dim_async(x, dim, group) : Pending{nullptr, x, nullptr};
    at::Tensor grad_input = g.matmul(w);
    const at::Tensor full = gathered.wait();
    Pending reduced = sp ? reduce_scatter_dim_async(grad_input, dim, group)
                         : all_reduce_sum_async(grad_input.contiguous(), group);
    at::Tensor grad_weight = weight_grad(g, full).to(weight_dtype);
    at::Tensor grad_bias;
    if (ctx->saved_data["has_bias"].toBool()) {
      grad_bias = g.reshape({-1, g.size(-1)}).sum(0).to(weight_dtype);
    }
    grad_input = reduced.wait().to(input_dtype);
    return {grad_input,   grad_weight,  grad_bias,   at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void check_linear(const at::Tensor& input,
                  const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias,
                  const ParallelOptions& options,
                  const char* op,
                  bool bias_split) {
  TORCH_CHECK_VALUE(options.group, "tensor_parallel.", op,
                    ": options.group is null; pass the tensor-parallel process group");
  TORCH_CHECK_VALUE(weight.dim() == 2, "tensor_parallel.", op, ": weight must be 2-D, got ",
                    weight.sizes());
  TORCH_CHECK_VALUE(input.dim() >= 1 && input.size(-1) == weight.size(1), "tensor_parallel.", op,
                    ": input ", input.sizes(), " does not match weight ", weight.sizes(),
                    " (the last dimension of input must be the weight's in_features, ",
                    weight.size(1), ")");
  if (bias && bias->defined()) {
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), "tensor_parallel.", op,
                      ": bias ", bias->sizes(), " does not match weight ", weight.sizes(),
                      bias_split ? " (the bias is split with the output features)"
                                 : " (the bias is replicated: all output features)");
  }
  if (options.sequence_parallel) {
    TORCH_CHECK_VALUE(input.dim() >= 2, "tensor_parallel.", op,
                      ": sequence_parallel needs an input with a sequence dimension, got ",
                      input.sizes());
  }
}

}  // namespace

at::Tensor column_parallel_linear(const at::Tensor& input,
                                  const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias,
                                  const ParallelOptions& options) {
  check_linear(input, weight, bias, options, "column_parallel_linear", true);
  const int64_t dim =
      options.sequence_dim < 0 ? options.sequence_dim + input.dim() : options.sequence_dim;
  return ColumnParallelFn::apply(input, weight, bias, options.group, options.sequence_parallel, dim,
                                 options.save_gathered);
}

at::Tensor row_parallel_linear(const at::Tensor& input,
                               const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias,
                               const ParallelOptions& options) {
  check_linear(input, weight, bias, options, "row_parallel_linear", false);
  const at::Tensor partial = at::linear(input, weight);  // ATen's autograd: local gradients
  at::Tensor out = options.sequence_parallel
                       ? reduce_scatter_along(partial, options.sequence_dim, options.group)
                       : reduce_from_region(partial, options.group);
  if (bias && bias->defined()) {
    const at::Tensor b = options.sequence_parallel ? copy_to_region(*bias, options.group) : *bias;
    out = out + b.to(out.scalar_type());
  }
  return out;
}

}  // namespace shardwise::tensor_parallel
