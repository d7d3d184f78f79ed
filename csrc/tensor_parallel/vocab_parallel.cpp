#include "tensor_parallel/vocab_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace shardwise::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum Reduction : int64_t { kMean = 0, kSum = 1, kNone = 2 };

Reduction reduction_of(const std::string& name) {
  if (name == "mean") return kMean;
  if (name == "sum") return kSum;
  if (name == "none") return kNone;
  TORCH_CHECK_VALUE(false, "tensor_parallel.vocab_parallel_cross_entropy: reduction '", name,
                    "'; valid: mean, sum, none");
}

struct VocabCrossEntropyFn : public torch::autograd::Function<VocabCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx,
                            const at::Tensor& logits,
                            const at::Tensor& targets,
                            Group group,
                            int64_t vocab_start,
                            int64_t ignore_index,
                            int64_t reduction) {
    const int64_t local_vocab = logits.size(-1);
    const at::Tensor l = logits.reshape({-1, local_vocab}).to(at::kFloat);
    const at::Tensor t = targets.reshape({-1});
    // max over the whole vocabulary (the gradient never flows through it)
    at::Tensor max = std::get<0>(l.max(1));
    max = all_reduce_max(max, group);
    const at::Tensor shifted = l - max.unsqueeze(1);
    const at::Tensor local_t = t - vocab_start;
    const at::Tensor in_range = local_t.ge(0).logical_and(local_t.lt(local_vocab));
    const at::Tensor index = local_t.masked_fill(in_range.logical_not(), 0);
    const at::Tensor target_logit =
        shifted.gather(1, index.unsqueeze(1)).squeeze(1).masked_fill(in_range.logical_not(), 0);
    const at::Tensor exp = shifted.exp();
    at::Tensor sums = at::stack({target_logit, exp.sum(1)});  // one all-reduce for both
    sums = all_reduce_sum(sums, group);
    const at::Tensor valid = t.ne(ignore_index);
    at::Tensor loss = (sums[1].log() - sums[0]).masked_fill(valid.logical_not(), 0);
    const at::Tensor count = valid.sum().to(at::kFloat);
    at::Tensor softmax = exp.div_(sums[1].unsqueeze(1));
    ctx->save_for_backward({softmax, index, in_range.logical_and(valid), valid, count});
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["logits_dtype"] = static_cast<int64_t>(logits.scalar_type());
    ctx->saved_data["logits_shape"] = logits.sizes().vec();
    if (reduction == kNone) return loss.reshape(targets.sizes()).to(logits.scalar_type());
    at::Tensor total = loss.sum();
    return reduction == kMean ? total / count : total;  // all ignored: 0 / 0 = nan, as torch
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &softmax = saved[0], &index = saved[1], &hit = saved[2], &valid = saved[3];
    const at::Tensor& count = saved[4];
    const int64_t reduction = ctx->saved_data["reduction"].toInt();
    at::Tensor grad = softmax.clone();
    grad.scatter_add_(1, index.unsqueeze(1), hit.to(at::kFloat).neg().unsqueeze(1));
    at::Tensor scale = grads[0].to(at::kFloat);
    if (reduction == kNone) {
      scale = scale.reshape({-1, 1});
    } else if (reduction == kMean) {
      scale = scale / count;
    }
    grad.mul_(valid.unsqueeze(1).to(at::kFloat)).mul_(scale);
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["logits_dtype"].toInt());
    return {grad.reshape(ctx->saved_data["logits_shape"].toIntVector()).to(dtype),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_embedding(const at::Tensor& ids,
                                    const at::Tensor& weight,
                                    int64_t vocab_start,
                                    const ParallelOptions& options) {
  TORCH_CHECK_VALUE(options.group,
                    "tensor_parallel.vocab_parallel_embedding: options.group is "
                    "null; pass the tensor-parallel process group");
  TORCH_CHECK_VALUE(weight.dim() == 2,
                    "tensor_parallel.vocab_parallel_embedding: weight must be "
                    "[vocab / tp, dim], got ",
                    weight.sizes());
  TORCH_CHECK_VALUE(!at::isFloatingType(ids.scalar_type()),
                    "tensor_parallel.vocab_parallel_embedding: ids must be integers, got ",
                    ids.scalar_type());
  const at::Tensor local = ids - vocab_start;
  const at::Tensor outside = local.lt(0).logical_or(local.ge(weight.size(0)));
  at::Tensor out = at::embedding(weight, local.masked_fill(outside, 0));
  out = out.masked_fill(outside.unsqueeze(-1), 0);
  return options.sequence_parallel ? reduce_scatter_along(out, options.sequence_dim, options.group)
                                   : reduce_from_region(out, options.group);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits,
                                        const at::Tensor& targets,
                                        const CrossEntropyOptions& options) {
  constexpr const char* op = "tensor_parallel.vocab_parallel_cross_entropy";
  TORCH_CHECK_VALUE(options.group, op, ": options.group is null; pass the tensor-parallel group");
  TORCH_CHECK_VALUE(
      logits.dim() >= 1 && logits.sizes().slice(0, logits.dim() - 1) == targets.sizes(), op,
      ": logits ", logits.sizes(), " and targets ", targets.sizes(),
      " do not match; logits must be [..., vocab / tp] over targets [...]");
  TORCH_CHECK_VALUE(targets.scalar_type() == at::kLong, op, ": targets must be int64, got ",
                    targets.scalar_type());
  return VocabCrossEntropyFn::apply(logits, targets, options.group, options.vocab_start,
                                    options.ignore_index, reduction_of(options.reduction));
}

}  // namespace shardwise::tensor_parallel
