#include "optim/fused_adamw.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <map>
#include <memory>

#include "optim/fused_optim_ops.h"

namespace shardwise::optim {

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults)
    : torch::optim::AdamW(std::move(params), std::move(defaults)) {
  check();
}

FusedAdamW::FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                       torch::optim::AdamWOptions defaults)
    : torch::optim::AdamW(groups, std::move(defaults)) {
  check();
}

void FusedAdamW::check() const {
  for (const auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(),
                "FusedAdamW: amsgrad is not supported; use "
                "torch::optim::AdamW for it");
    for (const auto& p : group.params()) {
      TORCH_CHECK(p.scalar_type() == at::kFloat && p.is_contiguous(),
                  "FusedAdamW: parameters must be contiguous float32 (got ", p.scalar_type(),
                  "); keep fp32 master weights and cast for compute");
    }
  }
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // One fused call per (step number, gradient dtype): normally the whole group.
    std::map<std::pair<int64_t, at::ScalarType>, std::vector<int64_t>> calls;
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      if (!p.grad().defined()) continue;
      auto& slot = state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Contiguous));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Contiguous));
        slot = std::move(fresh);
      }
      auto& param_state = static_cast<torch::optim::AdamWParamState&>(*slot);
      param_state.step(param_state.step() + 1);
      calls[{param_state.step(), p.grad().scalar_type()}].push_back(static_cast<int64_t>(i));
    }
    for (const auto& [key, indices] : calls) {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
      for (int64_t i : indices) {
        const at::Tensor& p = group.params()[i];
        auto& param_state =
            static_cast<torch::optim::AdamWParamState&>(*state()[p.unsafeGetTensorImpl()]);
        params.push_back(p);
        grads.push_back(p.grad().contiguous());
        exp_avgs.push_back(param_state.exp_avg());
        exp_avg_sqs.push_back(param_state.exp_avg_sq());
      }
      shardwise::optim::AdamWOptions fused;
      fused.lr = options.lr();
      fused.beta1 = std::get<0>(options.betas());
      fused.beta2 = std::get<1>(options.betas());
      fused.eps = options.eps();
      fused.weight_decay = options.weight_decay();
      fused.step = key.first;
      shardwise::fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, fused);
    }
  }
  return loss;
}

}  // namespace shardwise::optim
