// GradScaler from LibTorch: two thread ranks over the shardwise backend, only one of which sees
// an infinite gradient; both must report the overflow (so both skip the step and halve the
// scale after the hysteresis), and finite gradients come back divided by the scale.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "thread_group.h"
#include "zero/grad_scaler.h"

namespace {

TEST(GradScalerLibTorch, OverflowOnOneRankSkipsOnEveryRank) {
  on_thread_ranks(2, "gs", [](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    shardwise::zero::LossScalerOptions options;
    options.initial_scale = 8.0;
    options.hysteresis = 1;
    shardwise::zero::GradScaler scaler(options, group);
    torch::Tensor g = torch::full({4}, 8.0);
    bool overflow = scaler.unscale_({g});
    EXPECT_FALSE(overflow) << "rank " << rank;
    EXPECT_TRUE(torch::equal(g, torch::ones({4}))) << "unscaled by 1/8, rank " << rank;
    EXPECT_FALSE(scaler.update(overflow));
    torch::Tensor h = torch::ones({3});
    if (rank == 1) h[2] = std::numeric_limits<float>::infinity();
    overflow = scaler.unscale_({h, torch::Tensor()});  // an undefined gradient is skipped
    EXPECT_TRUE(overflow) << "rank " << rank << " must see rank 1's overflow";
    EXPECT_TRUE(scaler.update(overflow));
    EXPECT_EQ(scaler.scale(), 4.0) << "rank " << rank;
  });
}

}  // namespace
