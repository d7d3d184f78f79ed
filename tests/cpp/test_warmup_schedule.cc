// DeepSpeed's warmup schedules against values worked out by hand from its formulas (the Python
// test compares every iteration with deepspeed.runtime.lr_schedules itself), and the errors that
// name the key. Catches an off-by-one in the iteration (DeepSpeed's first step uses
// last_batch_iteration -1), log and linear warmups swapped, the decay's denominator, and the
// cosine's shift by one step.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "optim/warmup_schedule.h"

namespace shardwise::optim {
namespace {

WarmupScheduleOptions schedule(const std::string& type, const std::string& warmup) {
  WarmupScheduleOptions o;
  o.type = type;
  o.warmup_min_lr = 1e-4;
  o.warmup_max_lr = 1e-3;
  o.warmup_num_steps = 10;
  o.warmup_type = warmup;
  o.total_num_steps = 30;
  o.base_lr = 2e-3;
  o.warmup_min_ratio = 0.1;
  o.cos_min_ratio = 0.01;
  return o;
}

TEST(WarmupSchedule, WarmupLRRisesLogOrLinearThenHolds) {
  const auto log = schedule("WarmupLR", "log");
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(log, -1), 1e-4);
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(log, 0), 1e-4);  // log(1) = 0
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(log, 4), 1e-4 + 9e-4 * std::log(5.0) / std::log(10.0));
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(log, 10), 1e-3);
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(log, 1000), 1e-3);
  const auto linear = schedule("WarmupLR", "linear");
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(linear, 5), 1e-4 + 9e-4 * 0.5);
}

TEST(WarmupSchedule, WarmupDecayLRFallsLinearlyToZeroAtTheTotal) {
  const auto o = schedule("WarmupDecayLR", "linear");
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 10), 1e-4 + 9e-4 * 20.0 / 20.0);
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 20), 1e-4 + 9e-4 * 10.0 / 20.0);
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 30), 1e-4);
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 40), 1e-4);  // clamped at 0
}

TEST(WarmupSchedule, WarmupCosineLRScalesTheBaseLr) {
  const auto o = schedule("WarmupCosineLR", "linear");
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, -1), 0.0);
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 5), 2e-3 * (0.1 + 0.5 * 0.9));
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 9), 2e-3 * (0.1 + 0.9 * 0.9));
  // after the warmup the cosine starts one step in: (1 + cos(pi * 1 / 20)) / 2
  const double first = (1 + std::cos(M_PI / 20)) / 2;
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 10), 2e-3 * (0.01 + 0.99 * first));
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 29), 2e-3 * 0.01);
  EXPECT_DOUBLE_EQ(warmup_schedule_lr(o, 500), 2e-3 * 0.01);  // stays at the floor
}

TEST(WarmupSchedule, BadOptionsNameTheKey) {
  auto expect_error = [](WarmupScheduleOptions o, const std::string& words) {
    try {
      validate(o);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  auto o = schedule("OneCycle", "log");
  expect_error(o, "scheduler.type 'OneCycle'");
  o = schedule("WarmupLR", "exp");
  expect_error(o, "scheduler.params.warmup_type 'exp'");
  o = schedule("WarmupCosineLR", "log");
  o.total_num_steps = 0;
  expect_error(o, "total_num_steps must be > 0 for WarmupCosineLR");
  o = schedule("WarmupDecayLR", "log");
  o.total_num_steps = 0;
  expect_error(o, "total_num_steps must be > 0");
  EXPECT_NO_THROW(validate(schedule("WarmupDecayLR", "log")));
}

}  // namespace
}  // namespace shardwise::optim
