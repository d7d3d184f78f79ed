#include "optim/warmup_schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace shardwise::optim {
namespace {

constexpr double kPi = 3.14159265358979323846;

int64_t warmup_steps(const WarmupScheduleOptions& o) {
  return std::max<int64_t>(2, o.warmup_num_steps);
}

// The warmup's rise from 0 to 1 at iteration i < warmup_steps.
double rise(const WarmupScheduleOptions& o, int64_t i) {
  const auto steps = static_cast<double>(warmup_steps(o));
  if (o.warmup_type == "linear") return static_cast<double>(i) / steps;
  return (1.0 / std::log(steps)) * std::log(static_cast<double>(i + 1));
}

double cosine_ratio(const WarmupScheduleOptions& o, int64_t i) {
  if (i < 0) return 0.0;
  if (i < warmup_steps(o)) {
    return o.warmup_min_ratio + rise(o, i) * (1.0 - o.warmup_min_ratio);
  }
  const auto real_last = static_cast<double>(i - warmup_steps(o) + 1);
  const auto real_total =
      static_cast<double>(std::max<int64_t>(1, o.total_num_steps - warmup_steps(o)));
  const double progress = std::min(1.0, real_last / real_total);  // stays at the floor after
  const double ratio = (1 + std::cos(kPi * progress)) / 2;
  return std::max(0.0, o.cos_min_ratio + (1.0 - o.cos_min_ratio) * ratio);
}

double warmup_gamma(const WarmupScheduleOptions& o, int64_t i) {
  if (i < warmup_steps(o)) return rise(o, i);
  if (o.type == "WarmupLR") return 1.0;
  return std::max(0.0, static_cast<double>(o.total_num_steps - i) /
                           std::max(1.0, static_cast<double>(o.total_num_steps - warmup_steps(o))));
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

}  // namespace

void validate(const WarmupScheduleOptions& o) {
  require(o.type == "WarmupLR" || o.type == "WarmupDecayLR" || o.type == "WarmupCosineLR",
          "scheduler.type '" + o.type + "': use WarmupLR, WarmupDecayLR or WarmupCosineLR");
  require(o.warmup_type == "log" || o.warmup_type == "linear",
          "scheduler.params.warmup_type '" + o.warmup_type + "': use log or linear");
  require(o.warmup_num_steps >= 0, "scheduler.params.warmup_num_steps must be >= 0");
  if (o.type == "WarmupDecayLR") {
    require(o.total_num_steps > 0,
            "scheduler.params.total_num_steps must be > 0 for WarmupDecayLR");
  }
  if (o.type == "WarmupCosineLR") {
    require(o.total_num_steps > 0,
            "scheduler.params.total_num_steps must be > 0 for WarmupCosineLR");
  }
  require(o.warmup_min_lr >= 0 && o.warmup_max_lr >= 0 && o.base_lr >= 0,
          "scheduler.params: learning rates must be >= 0");
}

double warmup_schedule_lr(const WarmupScheduleOptions& o, int64_t last_batch_iteration) {
  if (o.type == "WarmupCosineLR") return o.base_lr * cosine_ratio(o, last_batch_iteration);
  if (last_batch_iteration < 0) return o.warmup_min_lr;
  return o.warmup_min_lr +
         (o.warmup_max_lr - o.warmup_min_lr) * warmup_gamma(o, last_batch_iteration);
}

}  // namespace shardwise::optim
