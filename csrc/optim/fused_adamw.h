// The fused AdamW as a torch::optim optimizer: torch::optim::AdamW's options, state, parameter
// groups, LR schedulers and save/load, with the step done by shardwise's fused kernel
// (optim/fused_optim_ops.h: one pass per parameter group, AVX-512 on CPU, a CUDA kernel on GPU).
//
//   shardwise::optim::FusedAdamW optimizer(model->parameters(),
//                                          torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
//
// Parameters and state are float32 (the kernel's contract); gradients float32, bfloat16 or
// float16. amsgrad is not supported (an error at construction says so).
#pragma once

#include <torch/optim/adamw.h>

#include <vector>

namespace shardwise::optim {

class FusedAdamW : public torch::optim::AdamW {
 public:
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {});
  explicit FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                      torch::optim::AdamWOptions defaults = {});
  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  void check() const;
};

}  // namespace shardwise::optim
