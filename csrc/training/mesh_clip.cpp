// The mesh-wide clip of mesh_clip.h.
#include "training/mesh_clip.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace shardwise::training {

MeshGradients mesh_gradients(const std::vector<std::pair<std::string, at::Tensor>>& named,
                             const std::function<bool(const std::string&)>& split,
                             const std::vector<std::string>& copies) {
  MeshGradients out;
  for (const auto& [name, parameter] : named) {
    const at::Tensor& grad = parameter.grad();
    if (!grad.defined()) continue;
    const bool copy = std::find(copies.begin(), copies.end(), name) != copies.end();
    (copy ? out.copies : split && split(name) ? out.split : out.replicated).push_back(grad);
  }
  return out;
}

double clip_grad_norm_over_mesh(const MeshGradients& grads,
                                const tensor_parallel::ClipOptions& options) {
  tensor_parallel::ClipOptions measure = options;
  measure.max_norm = 0.0;  // the norm only: the copies are scaled below with the rest
  const double norm = tensor_parallel::clip_grad_norm_(grads.split, grads.replicated, measure);
  const double scale = options.max_norm / (norm + 1e-6);
  if (options.max_norm > 0 && scale < 1.0) {
    for (const auto* kind : {&grads.split, &grads.replicated, &grads.copies}) {
      if (!kind->empty()) at::_foreach_mul_(*kind, scale);
    }
  }
  return norm;
}

}  // namespace shardwise::training
