// The learning rate of a training run at step `step` (1-based, as the trainers count): a linear
// warm-up from 0 to `peak_lr` over `warmup_steps`, then a cosine decay from `peak_lr` to
// `final_ratio` × `peak_lr` at `max_steps`, held there after it:
//
//   step <= warmup_steps:  peak_lr × step / warmup_steps
//   otherwise:             peak_lr × (final_ratio + (1 - final_ratio) × (1 + cos(π × progress)) /
//   2)
//                          progress = min(1, (step - warmup_steps) / max(1, max_steps -
//                          warmup_steps))
//
// shardwise-train and a LibTorch training loop (examples/cpp/train_gpt) both read it, so a run
// resumed in the other trainer goes on with the same rates. Torch-free.
#pragma once

#include <cstdint>

namespace shardwise::training {

struct WarmupCosineOptions {
  double peak_lr = 1e-3;
  int64_t warmup_steps = 0;  // 0: start at the peak
  int64_t max_steps = 1;
  double final_ratio = 0.1;  // the rate at max_steps, as a fraction of peak_lr
};

// Throws std::invalid_argument naming the option and the fix (peak_lr >= 0, max_steps >= 1,
// 0 <= warmup_steps <= max_steps, 0 <= final_ratio <= 1).
void check_warmup_cosine(const WarmupCosineOptions& options);

// The rate at `step` (checks `options` first; step >= 0).
double warmup_cosine_lr(const WarmupCosineOptions& options, int64_t step);

}  // namespace shardwise::training
