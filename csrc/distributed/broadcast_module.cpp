#include "distributed/broadcast_module.h"

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <vector>

namespace shardwise::distributed {

void broadcast_module(torch::nn::Module& module, c10d::ProcessGroup& group, int root) {
  std::vector<at::Tensor> tensors = module.parameters();
  for (const auto& b : module.buffers()) tensors.push_back(b);
  broadcast_tensors(tensors, group, root);
}

void broadcast_tensors(const std::vector<at::Tensor>& all, c10d::ProcessGroup& group, int root) {
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  std::set<const void*> seen;  // a tied tensor once
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) {
      by_dtype[t.scalar_type()].push_back(t);
    }
  };
  for (const auto& t : all) add(t);
  at::NoGradGuard no_grad;
  for (auto& [dtype, tensors] : by_dtype) {
    std::vector<at::Tensor> parts;
    for (const auto& t : tensors) parts.push_back(t.detach().reshape(-1));
    std::vector<at::Tensor> flat{at::cat(parts)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group.broadcast(flat, options)->wait();
    int64_t at = 0;
    for (auto& t : tensors) {
      t.detach().copy_(flat[0].narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
}

}  // namespace shardwise::distributed
