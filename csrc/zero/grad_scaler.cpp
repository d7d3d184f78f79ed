#include "zero/grad_scaler.h"

#include <ATen/ATen.h>

namespace shardwise::zero {

GradScaler::GradScaler(LossScalerOptions options, c10::intrusive_ptr<c10d::ProcessGroup> group)
    : scaler_(options), group_(std::move(group)) {}

bool GradScaler::unscale_(const std::vector<at::Tensor>& grads) {
  std::vector<at::Tensor> defined;
  for (const at::Tensor& g : grads) {
    if (g.defined()) defined.push_back(g);
  }
  // The overflow flag and the inverse scale live on the gradients' device: torch's unscale
  // kernel takes its tensors on one device (a CPU flag beside CUDA gradients is refused).
  const at::Device device = defined.empty() ? at::Device(at::kCPU) : defined.front().device();
  for (const at::Tensor& g : defined) {
    TORCH_CHECK(g.device() == device, "GradScaler.unscale_: gradients on ", device, " and ",
                g.device(), "; unscale each device's gradients with a call of its own");
  }
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor found = at::zeros({1}, options);
  const at::Tensor inv_scale = at::full({1}, 1.0 / scaler_.scale(), options);
  if (!defined.empty()) at::_amp_foreach_non_finite_check_and_unscale_(defined, found, inv_scale);
  if (group_ && group_->getSize() > 1) {
    std::vector<at::Tensor> flag{found};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    group_->allreduce(flag, max)->wait();
  }
  return found.item<float>() > 0;
}

}  // namespace shardwise::zero
