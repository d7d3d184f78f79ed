#include "distributed/average_gradients.h"

#include <ATen/ATen.h>

#include <map>
#include <tuple>

namespace shardwise::distributed {

void average_gradients(const std::vector<at::Tensor>& parameters, c10d::ProcessGroup& group) {
  const int size = group.getSize();
  if (size == 1) return;
  // (dtype, device) -> the gradients of that kind, packed together.
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> buckets;
  for (const at::Tensor& p : parameters) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const auto key = std::make_tuple(static_cast<int>(g.scalar_type()),
                                     static_cast<int>(g.device().type()), g.device().index());
    buckets[key].push_back(g);
  }
  for (auto& [key, grads] : buckets) {
    std::vector<at::Tensor> flat_views;
    for (const at::Tensor& g : grads) flat_views.push_back(g.reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(flat_views)};
    group.allreduce(flat)->wait();
    flat[0].div_(size);
    int64_t offset = 0;
    for (const at::Tensor& g : grads) {
      g.copy_(flat[0].narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
  }
}

}  // namespace shardwise::distributed
