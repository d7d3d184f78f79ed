// A gradient scaler for fp16 training with any strategy (DDP, FSDP, the pipeline, tensor
// parallelism): the dynamic LossScaler (loss_scaler.h) plus the one step it needs from ATen.
// unscale_() multiplies this rank's gradients (whatever shards it holds) by 1 / scale, notes
// any non-finite value, and all-reduces that flag (MAX) over `group`, so every rank skips the
// same steps and keeps the same scale, whichever rank overflowed.
#pragma once

#include <ATen/core/Tensor.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "zero/loss_scaler.h"

namespace shardwise::zero {

class GradScaler {
 public:
  GradScaler(LossScalerOptions options, c10::intrusive_ptr<c10d::ProcessGroup> group);

  double scale() const { return scaler_.scale(); }
  // Unscales `grads` in place; returns whether any rank of the group saw a non-finite gradient.
  bool unscale_(const std::vector<at::Tensor>& grads);
  // Records the step's outcome (from unscale_); returns true when the step must be skipped.
  bool update(bool overflow) { return scaler_.update(overflow); }
  const LossScaler& scaler() const { return scaler_; }
  LossScaler& scaler() { return scaler_; }

 private:
  LossScaler scaler_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;  // null: this rank alone
};

}  // namespace shardwise::zero
