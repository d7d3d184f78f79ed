// Dynamic loss scaling for fp16 training (DeepSpeed's DynamicLossScaler rules, so a config moved
// from DeepSpeed behaves the same).
//
// The loss is multiplied by `scale` before backward; the optimizer step unscales the gradients.
// After each step the caller reports whether any rank saw a non-finite gradient (the flag must
// already be reduced across ranks, so every rank updates identically):
// - overflow: the step is skipped. With `hysteresis` h > 1 the first h - 1 overflows (since the
//   last growth) only use up hysteresis; after that the scale is divided by `factor`, never
//   below `min_scale`.
// - no overflow: when the clean steps before this one since the last overflow (or the start) are
//   a positive multiple of `window`, scale *= `factor`, hysteresis refilled (DeepSpeed's rule).
// A static scale (dynamic = false) never changes, but overflowing steps are still skipped.
#pragma once

#include <cstdint>

namespace shardwise::zero {

struct LossScalerOptions {
  bool dynamic = true;
  double initial_scale = 65536.0;  // 2 ** initial_scale_power (or the static loss_scale)
  double factor = 2.0;
  int64_t window = 1000;  // loss_scale_window
  int hysteresis = 2;
  double min_scale = 1.0;
};

struct LossScalerState {
  double scale = 1.0;
  int64_t iteration = 0;
  int64_t last_overflow = -1;
  int hysteresis_left = 0;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options);

  double scale() const { return state_.scale; }
  // Records one optimizer step's outcome; returns true when the step must be skipped.
  bool update(bool overflow);

  const LossScalerOptions& options() const { return options_; }
  const LossScalerState& state() const { return state_; }
  void set_state(const LossScalerState& state) { state_ = state; }

 private:
  LossScalerOptions options_;
  LossScalerState state_;
};

}  // namespace shardwise::zero
