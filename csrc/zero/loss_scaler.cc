#include "zero/loss_scaler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace shardwise::zero {

LossScaler::LossScaler(LossScalerOptions options) : options_(options) {
  if (!(options_.initial_scale > 0)) {
    throw std::invalid_argument("loss scaler: initial scale must be > 0, got " +
                                std::to_string(options_.initial_scale));
  }
  if (options_.window < 1) {
    throw std::invalid_argument("loss scaler: loss_scale_window must be >= 1, got " +
                                std::to_string(options_.window));
  }
  if (options_.hysteresis < 1) {
    throw std::invalid_argument("loss scaler: hysteresis must be >= 1, got " +
                                std::to_string(options_.hysteresis));
  }
  if (!(options_.factor > 1)) {
    throw std::invalid_argument("loss scaler: factor must be > 1");
  }
  state_.scale = options_.initial_scale;
  state_.hysteresis_left = options_.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!options_.dynamic) {
    ++state_.iteration;
    return overflow;
  }
  if (overflow) {
    if (options_.hysteresis == 1 || state_.hysteresis_left == 1) {
      state_.scale = std::max(state_.scale / options_.factor, options_.min_scale);
    } else {
      --state_.hysteresis_left;
    }
    state_.last_overflow = state_.iteration;
  } else if (const int64_t clean_before = state_.iteration - state_.last_overflow - 1;
             clean_before > 0 && clean_before % options_.window == 0) {
    state_.hysteresis_left = options_.hysteresis;
    state_.scale *= options_.factor;
  }
  ++state_.iteration;
  return overflow;
}

}  // namespace shardwise::zero
