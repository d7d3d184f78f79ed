// data/batch_order.h: the one sampling rule of the training data (corpus windows and dataset
// items), swept over worlds, micro-batches and item counts.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <vector>

#include "data/batch_order.h"
#include "data/token_stream.h"

namespace {

using shardwise::data::BatchOrder;
using shardwise::data::BatchOrderOptions;

std::vector<BatchOrder> ranks_of(int64_t items, int64_t micro, int world, int64_t seed) {
  std::vector<BatchOrder> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back(items, BatchOrderOptions{micro, r, world, seed});
  return ranks;
}

// Deterministic training: micro-batch m of a step of 8 micro-batches (world W, accumulation
// 8 / W: stream batch j of the step, rank r, m = j * W + r) is the same items, in the same order,
// at every world. Catches a strided split, whose micro-batches change with the world size.
TEST(BatchOrder, ContiguousMicroBatchesDoNotDependOnTheWorld) {
  const int64_t micro = 3, items = 200, steps = 2, per_step = 8;
  std::vector<std::vector<at::Tensor>> by_world;
  for (int world : {1, 2, 4, 8}) {
    std::vector<BatchOrder> ranks;
    for (int r = 0; r < world; ++r)
      ranks.emplace_back(items, BatchOrderOptions{micro, r, world, 5, true, /*contiguous=*/true});
    std::vector<at::Tensor> micro_batches(steps * per_step);
    const int64_t accumulation = per_step / world;
    for (int64_t t = 0; t < steps; ++t) {
      for (int64_t j = 0; j < accumulation; ++j) {
        for (int r = 0; r < world; ++r) {
          micro_batches[t * per_step + j * world + r] =
              ranks[r].batch_items(0, t * accumulation + j);
        }
      }
    }
    by_world.push_back(micro_batches);
  }
  for (size_t w = 1; w < by_world.size(); ++w) {
    for (size_t m = 0; m < by_world[0].size(); ++m) {
      EXPECT_TRUE(at::equal(by_world[w][m], by_world[0][m])) << "world index " << w << " m " << m;
    }
  }
  // The strided split does differ (so the test can tell them apart).
  BatchOrder strided(items, BatchOrderOptions{micro, 0, 2, 5});
  EXPECT_FALSE(at::equal(strided.batch_items(0, 0), by_world[0][0]));
}

// The micro-batches of `steps` training steps of 8 micro-batches at `world` (accumulation
// 8 / world), read with next() across epoch ends, in micro-batch order m = j * world + r.
std::vector<at::Tensor> read_steps(int world, int64_t items, int64_t steps, bool whole_steps) {
  const int64_t micro = 3, per_step = 8, accumulation = per_step / world;
  std::vector<BatchOrder> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back(items, BatchOrderOptions{micro, r, world, 5, true, /*contiguous=*/true,
                                                whole_steps ? accumulation : 1});
  }
  std::vector<at::Tensor> out(steps * per_step);
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t j = 0; j < accumulation; ++j) {
      for (int r = 0; r < world; ++r) out[t * per_step + j * world + r] = ranks[r].next();
    }
  }
  return out;
}

// batches_per_step: 200 items hold 8 whole steps of 24 (8 dropped) at every world, so steps 9
// and 10 (epoch 1) read the same items at world 1, 2, 4 and 8. Catches an epoch that drops per
// global batch of micro x world (2 items at world 1, 8 at world 8): epoch 1 would start at
// another step and read other items.
TEST(BatchOrder, EpochsOfWholeStepsEndOnTheSameItemAtEveryWorld) {
  const auto one = read_steps(1, 200, 10, true);
  for (int world : {2, 4, 8}) {
    const auto other = read_steps(world, 200, 10, true);
    for (size_t m = 0; m < one.size(); ++m) {
      EXPECT_TRUE(at::equal(other[m], one[m])) << "world " << world << " m " << m;
    }
  }
  BatchOrder whole(200, BatchOrderOptions{3, 0, 2, 5, true, true, 4});
  EXPECT_EQ(whole.batches_per_epoch(), 32);  // 8 steps of 4 batches
  // Without it world 1's epoch ends mid-step and its epoch 1 differs (the test can fail).
  const auto per_batch = read_steps(1, 200, 10, false), eight = read_steps(8, 200, 10, false);
  EXPECT_FALSE(at::equal(per_batch.back(), eight.back()));
  EXPECT_THROW(BatchOrder(20, BatchOrderOptions{3, 0, 1, 5, true, true, 8}), std::invalid_argument);
}

// Catches ranks that overlap or miss items of a global batch, and a split that depends on the
// world size (the global batch must be the same slice of the epoch's order at every world).
TEST(BatchOrder, TheRanksSplitEachGlobalBatchOfTheSameOrder) {
  for (int world : {1, 2, 3, 4}) {
    for (int64_t micro : {1, 2, 5}) {
      for (int64_t items : {world * micro, 17 * world * micro + 3}) {
        auto ranks = ranks_of(items, micro, world, 7);
        const at::Tensor order = ranks[0].order(1);
        ASSERT_EQ(ranks[0].batches_per_epoch(), items / (micro * world));
        for (int64_t b = 0; b < ranks[0].batches_per_epoch(); ++b) {
          std::multiset<int64_t> read;
          for (auto& rank : ranks) {
            const at::Tensor mine = rank.batch_items(1, b);
            ASSERT_EQ(mine.numel(), micro);
            for (int64_t i = 0; i < micro; ++i) read.insert(mine[i].item<int64_t>());
          }
          std::multiset<int64_t> expected;
          for (int64_t i = 0; i < micro * world; ++i)
            expected.insert(order[b * micro * world + i].item<int64_t>());
          EXPECT_EQ(read, expected) << "world " << world << " micro " << micro << " batch " << b;
        }
      }
    }
  }
}

// Catches an order that is not reproducible from (seed, epoch) or that repeats across epochs.
TEST(BatchOrder, TheOrderIsAPermutationSeededBySeedAndEpoch) {
  BatchOrder a(50, {5, 0, 2, 3});
  BatchOrder b(50, {5, 1, 2, 3});
  EXPECT_TRUE(at::equal(a.order(4), b.order(4)));
  EXPECT_FALSE(at::equal(a.order(4), a.order(5)));
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(a.order(4))), at::arange(50, at::kLong)));
  BatchOrder in_order(50, {5, 0, 2, 3, /*shuffle=*/false});
  EXPECT_TRUE(at::equal(in_order.order(9), at::arange(50, at::kLong)));
}

// Catches a position that does not wrap into the next epoch or does not restore.
TEST(BatchOrder, NextAdvancesAndWrapsAndLoadStateRestores) {
  BatchOrder order(12, {2, 1, 2, 0});
  ASSERT_EQ(order.batches_per_epoch(), 3);
  std::vector<at::Tensor> seen;
  for (int i = 0; i < 4; ++i) seen.push_back(order.next());
  EXPECT_EQ(order.epoch(), 1);
  EXPECT_EQ(order.index(), 1);
  EXPECT_TRUE(at::equal(seen[3], order.batch_items(1, 0)));
  order.load_state(0, 2);
  EXPECT_TRUE(at::equal(order.next(), seen[2]));
  EXPECT_THROW(order.load_state(0, 3), std::invalid_argument);
}

// Catches bad options accepted, and a TokenStream that reads other windows than its order.
TEST(BatchOrder, RefusesBadOptionsAndDrivesTheTokenStream) {
  EXPECT_THROW(BatchOrder(10, {0, 0, 1}), std::invalid_argument);
  EXPECT_THROW(BatchOrder(10, {1, 2, 2}), std::invalid_argument);
  EXPECT_THROW(BatchOrder(3, {2, 0, 2}), std::invalid_argument);
  const at::Tensor tokens = at::arange(401, at::kLong);
  shardwise::data::TokenStream stream(tokens, {10, 2, 1, 2, 5});
  BatchOrder windows(40, {2, 1, 2, 5});
  for (int i = 0; i < 25; ++i) {
    const auto [inputs, targets] = stream.next();
    const at::Tensor starts = windows.next() * 10;
    EXPECT_TRUE(at::equal(inputs.select(1, 0), starts));
    EXPECT_TRUE(at::equal(targets.select(1, 9), starts + 10));
  }
}

}  // namespace
