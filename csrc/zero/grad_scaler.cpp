#include "zero/grad_scaler.h"

#include <ATen/ATen.h>

namespace shardwise::zero {

GradScaler::GradScaler(LossScalerOptions options, c10::intrusive_ptr<c10d::ProcessGroup> group)
    : scaler_(options), group_(std::move(group)) {}

bool GradScaler::unscale_(const std::vector<at::Tensor>& grads) {
  at::Tensor found = at::zeros({1}, at::kFloat);
  const at::Tensor inv_scale = at::full({1}, 1.0 / scaler_.scale(), at::kFloat);
  std::vector<at::Tensor> defined;
  for (const at::Tensor& g : grads) {
    if (g.defined()) defined.push_back(g);
  }
  if (!defined.empty()) at::_amp_foreach_non_finite_check_and_unscale_(defined, found, inv_scale);
  if (group_ && group_->getSize() > 1) {
    std::vector<at::Tensor> flag{found};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MAX;
    group_->allreduce(flag, options)->wait();
  }
  return found.item<float>() > 0;
}

}  // namespace shardwise::zero
