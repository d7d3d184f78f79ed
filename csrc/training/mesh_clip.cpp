// The mesh-wide clip of mesh_clip.h.
#include "training/mesh_clip.h"

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

MeshGradients mesh_gradients(const tensor_parallel::ShardedParameters& params) {
  return mesh_gradients(params.named(),
                        [&params](const std::string& name) { return params.split(name); });
}

double clip_grad_norm_over_mesh(const MeshGradients& grads,
                                const tensor_parallel::ClipOptions& options) {
  return tensor_parallel::clip_grad_norm_(grads.split, grads.replicated, options, grads.copies);
}

}  // namespace shardwise::training
