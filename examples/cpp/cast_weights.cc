// LibTorch: cast a module's fp32 weights to bf16 copies with shardwise's ops, no Python.
// Built by CMake (target shardwise_example_cast) when LibTorch is found:
//   cmake -S . -B build/cmake -DCMAKE_PREFIX_PATH=<libtorch>; ./build/cmake/shardwise_example_cast
#include <torch/torch.h>

#include <iostream>

#include "precision/cast_ops.h"

int main() {
  torch::manual_seed(0);
  torch::nn::Linear layer(256, 128);
  std::vector<at::Tensor> masters, copies;
  for (const auto& p : layer->parameters()) {
    masters.push_back(p.detach());
    copies.push_back(torch::empty_like(p, p.options().dtype(at::kBFloat16)));
  }
  const bool overflow = shardwise::multi_cast_(masters, copies).item<bool>();
  const double max_error = (copies[0].to(at::kFloat) - masters[0]).abs().max().item<double>();
  std::cout << "cast " << masters.size() << " tensors to bf16, overflow=" << overflow
            << ", max |bf16 - fp32| = " << max_error << "\n";
  return overflow ? 1 : 0;
}
