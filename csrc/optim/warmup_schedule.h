// DeepSpeed's learning-rate schedules (the `scheduler` section of a DeepSpeed config), torch-free,
// value for value as deepspeed.runtime.lr_schedules computes them (tested against it):
//
//   WarmupLR:       lr = warmup_min_lr + (warmup_max_lr - warmup_min_lr) * gamma, where gamma
//                   rises over warmup_num_steps (log: log(i + 1) / log(warmup_num_steps); linear:
//                   i / warmup_num_steps) and is 1 afterwards;
//   WarmupDecayLR:  the same warmup, then gamma = max(0, (total_num_steps - i) /
//                   max(1, total_num_steps - warmup_num_steps));
//   WarmupCosineLR: lr = base_lr * ratio, ratio rising from warmup_min_ratio to 1 over the
//                   warmup, then (1 + cos(pi * p)) / 2 scaled into [cos_min_ratio, 1], where
//                   p = min(1, (i - warmup_num_steps + 1) / max(1, total_num_steps -
//                   warmup_num_steps)): at the floor from total_num_steps on (DeepSpeed 0.19).
//
// `i` is DeepSpeed's last_batch_iteration: -1 before the first scheduler step (the lr the first
// optimizer step uses: warmup_min_lr, or 0 for WarmupCosineLR), then 0, 1, ... after each.
// warmup_num_steps below 2 count as 2, as in DeepSpeed.
#pragma once

#include <cstdint>
#include <string>

namespace shardwise::optim {

struct WarmupScheduleOptions {
  std::string type = "WarmupLR";  // WarmupLR | WarmupDecayLR | WarmupCosineLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // log | linear
  int64_t total_num_steps = 0;      // WarmupDecayLR, WarmupCosineLR
  double base_lr = 1e-3;            // WarmupCosineLR: the optimizer's lr
  double warmup_min_ratio = 0.0;    // WarmupCosineLR
  double cos_min_ratio = 1e-4;      // WarmupCosineLR
};

// Throws std::invalid_argument naming the key (scheduler.type, scheduler.params.<key>).
void validate(const WarmupScheduleOptions& options);

// The learning rate after `last_batch_iteration` scheduler steps (-1: none yet).
double warmup_schedule_lr(const WarmupScheduleOptions& options, int64_t last_batch_iteration);

}  // namespace shardwise::optim
