// exact_norm: the bins of every piece, one int64 all-reduce of their limbs, one fixed rounding.
#include "distributed/exact_norm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "distributed/exact_square_sum.h"

namespace shardwise::distributed {

double exact_norm(const std::vector<at::Tensor>& pieces, c10d::ProcessGroup* group) {
  ExactSquareSum sum;
  at::Device device(at::kCPU);
  for (const auto& piece : pieces) {
    if (!piece.defined() || piece.numel() == 0) continue;
    TORCH_CHECK_VALUE(at::isFloatingType(piece.scalar_type()) && piece.scalar_type() != at::kDouble,
                      "exact_norm: pieces must be float32, bfloat16 or float16, got ",
                      piece.scalar_type());
    device = piece.device();
    const at::Tensor values = piece.detach().to(at::kCPU, at::kFloat).contiguous();
    sum.add(values.data_ptr<float>(), static_cast<size_t>(values.numel()));
  }
  std::vector<int64_t> limbs = sum.limbs();
  if (group != nullptr && group->getSize() > 1) {
    at::Tensor exchanged = at::tensor(limbs, at::kLong).to(device);
    std::vector<at::Tensor> tensors{exchanged};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    group->allreduce(tensors, options)->wait();
    const at::Tensor back = exchanged.cpu();
    limbs.assign(back.data_ptr<int64_t>(), back.data_ptr<int64_t>() + back.numel());
  }
  return std::sqrt(ExactSquareSum::value(limbs));
}

double clip_grad_norm_exact_(const std::vector<at::Tensor>& grads,
                             double max_norm,
                             c10d::ProcessGroup* group) {
  const double norm = exact_norm(grads, group);
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (const auto& g : grads) {
      if (g.defined()) at::Tensor(g).mul_(coefficient);
    }
  }
  return norm;
}

}  // namespace shardwise::distributed
