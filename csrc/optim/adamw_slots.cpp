#include "optim/adamw_slots.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>

namespace shardwise::optim {

namespace {

// Where `slot` (a 1-D view of `param`'s elements) starts in the flattened parameter.
int64_t offset_in(const sharding::TensorSlice& slot, const at::Tensor& param) {
  const int64_t offset = slot.values.storage_offset() - param.storage_offset();
  TORCH_CHECK_VALUE(slot.values.dim() == 1 && slot.values.stride(0) == 1 && param.is_contiguous() &&
                        slot.values.is_alias_of(param) && offset >= 0 &&
                        offset + slot.values.numel() <= param.numel(),
                    "adamw_slots: the slot of '", slot.name,
                    "' is not a 1-D view of its parameter's elements; pass param.view(-1) or a "
                    "narrow of it");
  return offset;
}

}  // namespace

std::vector<sharding::TensorSlice> adamw_slots(
    const std::vector<sharding::TensorSlice>& parameter_slots,
    const std::vector<at::Tensor>& params,
    torch::optim::AdamW& optimizer,
    bool create_state) {
  TORCH_CHECK_VALUE(parameter_slots.size() == params.size(),
                    "adamw_slots: ", parameter_slots.size(), " slots for ", params.size(),
                    " parameters");
  std::vector<sharding::TensorSlice> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& slot = parameter_slots[i];
    out.push_back(slot);
    auto& state = optimizer.state()[params[i].unsafeGetTensorImpl()];
    if (!state && create_state) {
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->exp_avg(at::zeros_like(params[i], at::MemoryFormat::Contiguous));
      fresh->exp_avg_sq(at::zeros_like(params[i], at::MemoryFormat::Contiguous));
      state = std::move(fresh);
    }
    if (!state) {
      optimizer.state().erase(params[i].unsafeGetTensorImpl());
      continue;
    }
    auto& adamw = static_cast<torch::optim::AdamWParamState&>(*state);
    const int64_t n = slot.values.numel(), offset = offset_in(slot, params[i]);
    out.push_back(
        {slot.name + ":exp_avg", slot.start, adamw.exp_avg().view(-1).narrow(0, offset, n)});
    out.push_back(
        {slot.name + ":exp_avg_sq", slot.start, adamw.exp_avg_sq().view(-1).narrow(0, offset, n)});
  }
  return out;
}

int64_t adamw_step_count(torch::optim::AdamW& optimizer) {
  int64_t step = 0;
  for (const auto& [key, state] : optimizer.state()) {
    step = std::max(step, static_cast<torch::optim::AdamWParamState&>(*state).step());
  }
  return step;
}

void set_adamw_step_count(torch::optim::AdamW& optimizer, int64_t step) {
  for (auto& [key, state] : optimizer.state()) {
    static_cast<torch::optim::AdamWParamState&>(*state).step(step);
  }
}

}  // namespace shardwise::optim
