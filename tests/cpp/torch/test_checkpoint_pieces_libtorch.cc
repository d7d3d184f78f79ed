// Checkpoint pieces from LibTorch: a tensor saved as pieces cut for one world size loads into
// slices cut for another (every element from the piece that holds it), and a slice no piece
// covers is an error naming the tensor.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "sharding/checkpoint_pieces.h"

namespace {

using shardwise::sharding::TensorSlice;

TEST(CheckpointPieces, SlicesOfAnotherWorldSizeGetEveryElement) {
  const torch::Tensor full = torch::arange(10, torch::kFloat);
  // Saved by 3 ranks (4 + 4 + 2 elements), loaded by 2 ranks (5 + 5).
  std::vector<TensorSlice> saved{{"w", 0, full.narrow(0, 0, 4)},
                                 {"w", 4, full.narrow(0, 4, 4)},
                                 {"w", 8, full.narrow(0, 8, 2)},
                                 {"other", 0, torch::full({3}, -1.0)}};
  torch::Tensor a = torch::zeros({5}), b = torch::zeros({5});
  shardwise::sharding::fill_from_pieces({{"w", 0, a}, {"w", 5, b}}, saved);
  EXPECT_TRUE(torch::equal(a, full.narrow(0, 0, 5)));
  EXPECT_TRUE(torch::equal(b, full.narrow(0, 5, 5)));
}

TEST(CheckpointPieces, AnUncoveredElementNamesTheTensor) {
  std::vector<TensorSlice> saved{{"w", 0, torch::ones({4})}};
  torch::Tensor mine = torch::zeros({4});
  try {
    shardwise::sharding::fill_from_pieces({{"w", 2, mine}}, saved);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cover only 2 of the 4 elements [2, 6) of 'w'"),
              std::string::npos)
        << e.what();
  }
  shardwise::sharding::fill_from_pieces({{"w", 2, mine}}, saved, /*strict=*/false);
  EXPECT_EQ(mine[0].item<float>(), 1.0f);
  EXPECT_EQ(mine[3].item<float>(), 0.0f);
}

}  // namespace
