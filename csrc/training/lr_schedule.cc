// The warm-up and cosine decay of lr_schedule.h.
#include "training/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace shardwise::training {

void check_warmup_cosine(const WarmupCosineOptions& options) {
  if (!(options.peak_lr >= 0)) {
    throw std::invalid_argument("learning rate schedule: peak_lr " +
                                std::to_string(options.peak_lr) + " must not be negative");
  }
  if (options.max_steps < 1) {
    throw std::invalid_argument("learning rate schedule: max_steps " +
                                std::to_string(options.max_steps) + " must be at least 1");
  }
  if (options.warmup_steps < 0 || options.warmup_steps > options.max_steps) {
    throw std::invalid_argument(
        "learning rate schedule: warmup_steps " + std::to_string(options.warmup_steps) +
        " must lie in [0, max_steps " + std::to_string(options.max_steps) + "]");
  }
  if (!(options.final_ratio >= 0 && options.final_ratio <= 1)) {
    throw std::invalid_argument("learning rate schedule: final_ratio " +
                                std::to_string(options.final_ratio) + " must lie in [0, 1]");
  }
}

double warmup_cosine_lr(const WarmupCosineOptions& options, int64_t step) {
  check_warmup_cosine(options);
  if (step < 0) {
    throw std::invalid_argument("learning rate schedule: step " + std::to_string(step) +
                                " is negative");
  }
  const auto warmup_steps = static_cast<double>(options.warmup_steps);
  if (options.warmup_steps > 0 && step <= options.warmup_steps) {
    return options.peak_lr * static_cast<double>(step) / warmup_steps;
  }
  const double span =
      static_cast<double>(std::max<int64_t>(1, options.max_steps - options.warmup_steps));
  const double progress = std::min(1.0, (static_cast<double>(step) - warmup_steps) / span);
  const double cosine = 0.5 * (1 + std::cos(M_PI * progress));
  return options.peak_lr * (options.final_ratio + (1 - options.final_ratio) * cosine);
}

}  // namespace shardwise::training
