// The dynamic loss scaler against sequences worked out by hand from DeepSpeed's rules
// (deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler.update_scale).
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "zero/loss_scaler.h"

namespace shardwise::zero {
namespace {

TEST(LossScaler, GrowsEveryWindowBacksOffAfterHysteresisAndStopsAtTheMinimum) {
  LossScalerOptions options;
  options.initial_scale = 16;
  options.window = 3;
  options.hysteresis = 2;
  options.min_scale = 2;
  LossScaler scaler(options);
  // DeepSpeed's DynamicLossScaler(16, 3, 2, 2, False) on the same overflows gives this scale:
  // iteration 0 1 2 clean (a growth needs 3 clean steps before it) | 3: the overflow uses up
  // hysteresis | 4, 5: overflows halve | 6 7 8 clean (the growth would come at 9) | 9..13:
  // overflows halve at once (hysteresis refills only on growth) down to the minimum.
  const std::vector<bool> overflow = {false, false, false, true, true, true, false,
                                      false, false, true,  true, true, true, true};
  const std::vector<double> scale = {16, 16, 16, 16, 8, 4, 4, 4, 4, 2, 2, 2, 2, 2};
  for (size_t i = 0; i < overflow.size(); ++i) {
    EXPECT_EQ(scaler.update(overflow[i]), overflow[i]) << "iteration " << i;
    EXPECT_EQ(scaler.scale(), scale[i]) << "iteration " << i;
  }
}

TEST(LossScaler, GrowsAfterWindowPlusOneCleanStepsAsDeepSpeed) {
  LossScalerOptions options;
  options.initial_scale = 16;
  options.window = 2;
  options.hysteresis = 1;
  LossScaler scaler(options);
  // DeepSpeed's DynamicLossScaler(16, 2, 1, 1, False): the third clean step grows (two clean
  // steps before it), an overflow halves, and growth resumes three clean steps later.
  const std::vector<bool> overflow = {false, false, false, true, false, false, false, false, false};
  const std::vector<double> scale = {16, 16, 32, 16, 16, 16, 32, 32, 64};
  for (size_t i = 0; i < overflow.size(); ++i) {
    scaler.update(overflow[i]);
    EXPECT_EQ(scaler.scale(), scale[i]) << "iteration " << i;
  }
}

TEST(LossScaler, HysteresisOneBacksOffAtOnce) {
  LossScalerOptions options;
  options.initial_scale = 1024;
  options.hysteresis = 1;
  LossScaler scaler(options);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 256);
}

TEST(LossScaler, StaticScaleNeverChangesButStillSkipsOverflows) {
  LossScalerOptions options;
  options.dynamic = false;
  options.initial_scale = 128;
  options.window = 1;
  LossScaler scaler(options);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 128);
}

TEST(LossScaler, StateRoundTripsForCheckpoints) {
  LossScalerOptions options;
  options.initial_scale = 8;
  options.window = 2;
  LossScaler a(options);
  a.update(false);
  a.update(true);
  LossScaler b(options);
  b.set_state(a.state());
  for (bool overflow : {false, false, true, false}) {
    a.update(overflow);
    b.update(overflow);
    EXPECT_EQ(a.scale(), b.scale());
  }
}

TEST(LossScaler, BadOptionsAreRejected) {
  LossScalerOptions options;
  options.window = 0;
  EXPECT_THROW(LossScaler{options}, std::invalid_argument);
  options.window = 1;
  options.initial_scale = 0;
  EXPECT_THROW(LossScaler{options}, std::invalid_argument);
  options.initial_scale = 1;
  options.hysteresis = 0;
  EXPECT_THROW(LossScaler{options}, std::invalid_argument);
}

}  // namespace
}  // namespace shardwise::zero
