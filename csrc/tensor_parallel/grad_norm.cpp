#include "tensor_parallel/grad_norm.h"

#include <ATen/ATen.h>

#include <cmath>

namespace shardwise::tensor_parallel {
namespace {

double sum_of_squares(const std::vector<at::Tensor>& grads) {
  double total = 0.0;
  for (const at::Tensor& g : grads) {
    if (g.defined()) total += g.detach().to(at::kDouble).pow(2).sum().item<double>();
  }
  return total;
}

bool spans_ranks(const Group& group) { return group && group->getSize() > 1; }

}  // namespace

double global_norm(double split_squares, double replicated_squares, const ClipOptions& options) {
  // squares = [split, replicated]: both summed over the shards, only the split over tp
  at::Tensor squares = at::tensor({split_squares, replicated_squares}, at::kDouble);
  if (spans_ranks(options.shard_group)) squares = all_reduce_sum(squares, options.shard_group);
  if (spans_ranks(options.stage_group)) squares = all_reduce_sum(squares, options.stage_group);
  if (spans_ranks(options.tp_group)) {
    at::Tensor split = squares.narrow(0, 0, 1);
    split.copy_(all_reduce_sum(split, options.tp_group));
  }
  return std::sqrt(squares.sum().item<double>());
}

double clip_grad_norm_(const std::vector<at::Tensor>& split_grads,
                       const std::vector<at::Tensor>& replicated_grads,
                       const ClipOptions& options,
                       const std::vector<at::Tensor>& copies) {
  const double norm =
      global_norm(sum_of_squares(split_grads), sum_of_squares(replicated_grads), options);
  const double scale = options.max_norm / (norm + 1e-6);
  if (options.max_norm > 0 && scale < 1.0) {
    for (const auto* grads : {&split_grads, &replicated_grads, &copies}) {
      std::vector<at::Tensor> defined;
      for (const at::Tensor& g : *grads) {
        if (g.defined()) defined.push_back(g.detach());
      }
      if (!defined.empty()) at::_foreach_mul_(defined, scale);
    }
  }
  return norm;
}

}  // namespace shardwise::tensor_parallel
