// The torch-free sharding core: the flat layout's padding rule, and the four copy plans executed
// by copy_runs_cpu, checked element by element against direct index arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "precision/cast_math.h"
#include "sharding/copy_runs.h"
#include "sharding/copy_tiles.h"
#include "sharding/flat_layout.h"
#include "sharding/shard_plans.h"

namespace shardwise::sharding {
namespace {

const std::vector<std::vector<int64_t>> kGroups = {
    {},                     // no parameters
    {0},                    // an empty parameter
    {1},                    // fewer elements than ranks
    {7, 1, 33},             // uneven everywhere
    {64, 128, 5, 1000, 3},  // mixed
    {4096},                 // one large, evenly divisible
};

TEST(FlatLayout, PiecesCoverEveryElementOnceAndPadToTheAlignment) {
  for (const auto& numels : kGroups) {
    for (int world = 1; world <= 5; ++world) {
      for (int64_t align : {1, 16}) {
        FlatLayout layout({numels, world, align});
        int64_t offset = 0;
        for (int64_t i = 0; i < layout.num_params(); ++i) {
          EXPECT_EQ(layout.offset(i), offset);
          EXPECT_EQ(layout.chunk(i) % align, 0);
          EXPECT_GE(layout.chunk(i) * world, numels[i]);
          EXPECT_LT(layout.chunk(i) * world, numels[i] + world * align);  // padding is minimal
          int64_t covered = 0;
          for (int r = 0; r < world; ++r) {
            EXPECT_EQ(layout.start(i, r), covered < numels[i] ? covered : layout.start(i, r));
            covered += layout.valid(i, r);
          }
          EXPECT_EQ(covered, numels[i]);
          offset += layout.chunk(i);
        }
        EXPECT_EQ(layout.shard_numel(), offset);
        int64_t valid = 0;
        for (int r = 0; r < world; ++r) valid += layout.valid_in_shard(r);
        EXPECT_EQ(valid, layout.param_numel());
      }
    }
  }
}

TEST(FlatLayout, RejectsBadOptions) {
  EXPECT_THROW(FlatLayout({{4}, 0, 16}), std::invalid_argument);
  EXPECT_THROW(FlatLayout({{-1}, 2, 16}), std::invalid_argument);
  EXPECT_THROW(FlatLayout({{4}, 2, 0}), std::invalid_argument);
}

std::vector<std::vector<float>> random_params(const std::vector<int64_t>& numels, int seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::vector<std::vector<float>> params;
  for (int64_t n : numels) {
    params.emplace_back(n);
    for (float& x : params.back()) x = value(generator);
  }
  return params;
}

// All-gather round trip: copy-in on every rank, concatenate the shards, copy-out: bit-exact.
TEST(ShardPlans, AllGatherCopyInThenCopyOutRestoresEveryParameter) {
  for (const auto& numels : kGroups) {
    for (int world = 1; world <= 5; ++world) {
      FlatLayout layout({numels, world, 16});
      const auto params = random_params(numels, world);
      std::vector<float> gathered(layout.total_numel(), -1.0f);
      for (int r = 0; r < world; ++r) {
        std::vector<const void*> shards;
        for (int64_t i = 0; i < layout.num_params(); ++i) {
          shards.push_back(params[i].data() + layout.start(i, r));
        }
        auto runs = plan_all_gather_copy_in(layout, r, shards,
                                            gathered.data() + r * layout.shard_numel(), {4, 4});
        copy_runs_cpu(runs.data(), runs.size(), {});
      }
      for (int64_t i = 0; i < layout.num_params(); ++i) {  // padding is zero
        for (int r = 0; r < world; ++r) {
          for (int64_t k = layout.valid(i, r); k < layout.chunk(i); ++k) {
            ASSERT_EQ(gathered[r * layout.shard_numel() + layout.offset(i) + k], 0.0f);
          }
        }
      }
      std::vector<std::vector<float>> full;
      std::vector<void*> outputs;
      for (int64_t n : numels) full.emplace_back(n, -7.0f);
      for (auto& f : full) outputs.push_back(f.data());
      auto runs = plan_all_gather_copy_out(layout, gathered.data(), outputs, {4, 4});
      copy_runs_cpu(runs.data(), runs.size(), {});
      EXPECT_EQ(full, params) << "world " << world;
    }
  }
}

// Copy-in casts to bfloat16 in the same pass: each element equals the scalar reference cast.
TEST(ShardPlans, AllGatherCopyInCastsToBf16) {
  const std::vector<int64_t> numels = {7, 1, 33};
  FlatLayout layout({numels, 3, 16});
  const auto params = random_params(numels, 11);
  for (int r = 0; r < 3; ++r) {
    std::vector<const void*> shards;
    for (int64_t i = 0; i < layout.num_params(); ++i)
      shards.push_back(params[i].data() + layout.start(i, r));
    std::vector<uint16_t> shard(layout.shard_numel(), 0xffff);
    auto runs = plan_all_gather_copy_in(layout, r, shards, shard.data(), {4, 2});
    copy_runs_cpu(runs.data(), runs.size(), {Element::kFloat32, Element::kBFloat16});
    for (int64_t i = 0; i < layout.num_params(); ++i) {
      for (int64_t k = 0; k < layout.chunk(i); ++k) {
        const uint16_t expected =
            k < layout.valid(i, r) ? precision::float_to_bf16_bits(
                                         precision::float_bits(params[i][layout.start(i, r) + k]))
                                   : 0;
        ASSERT_EQ(shard[layout.offset(i) + k], expected);
      }
    }
  }
}

// Reduce-scatter: copy-in (pre-divided) on every rank, sum the buffers as the collective would,
// copy-out each rank's block accumulating (post-divided) into its sharded gradients.
TEST(ShardPlans, ReduceScatterCopyInAndOutMatchTheDirectSum) {
  for (const auto& numels : kGroups) {
    for (int world = 1; world <= 4; ++world) {
      FlatLayout layout({numels, world, 16});
      std::vector<std::vector<std::vector<float>>> grads;  // [rank][param]
      for (int r = 0; r < world; ++r) grads.push_back(random_params(numels, 100 + r));
      std::vector<double> sum(layout.total_numel(), 0.0);
      for (int r = 0; r < world; ++r) {
        std::vector<const void*> sources;
        for (int64_t i = 0; i < layout.num_params(); ++i)
          sources.push_back(i == 1 ? nullptr : grads[r][i].data());  // param 1: no gradient
        std::vector<float> buffer(layout.total_numel(), 99.0f);
        auto runs = plan_reduce_scatter_copy_in(layout, sources, buffer.data(), {4, 4});
        copy_runs_cpu(runs.data(), runs.size(), {Element::kFloat32, Element::kFloat32, 0.5});
        for (size_t k = 0; k < buffer.size(); ++k) sum[k] += buffer[k];
      }
      for (int r = 0; r < world; ++r) {
        std::vector<float> reduced(sum.begin() + r * layout.shard_numel(),
                                   sum.begin() + (r + 1) * layout.shard_numel());
        std::vector<std::vector<float>> shard_grads;
        std::vector<void*> outputs;
        for (int64_t i = 0; i < layout.num_params(); ++i)
          shard_grads.emplace_back(layout.valid(i, r), 1.0f);  // accumulate onto ones
        for (auto& g : shard_grads) outputs.push_back(g.data());
        auto runs = plan_reduce_scatter_copy_out(layout, r, reduced.data(), outputs, {4, 4});
        copy_runs_cpu(runs.data(), runs.size(),
                      {Element::kFloat32, Element::kFloat32, 2.0, /*accumulate=*/true});
        for (int64_t i = 0; i < layout.num_params(); ++i) {
          for (int64_t k = 0; k < layout.valid(i, r); ++k) {
            double expected = 0;
            for (int s = 0; s < world; ++s) {
              expected += i == 1 ? 0.0 : grads[s][i][layout.start(i, r) + k] * 0.5f;
            }
            ASSERT_NEAR(shard_grads[i][k], 1.0 + 2.0 * static_cast<float>(expected), 1e-5)
                << "world " << world << " param " << i << " element " << k;
          }
        }
      }
    }
  }
}

// copy_element: every (source, destination) pair rounds like a direct conversion in the
// compute type; accumulation adds in the compute type and rounds once.
TEST(CopyRuns, ConversionsScaleAndAccumulateRoundOnce) {
  std::vector<float> src = {1.0f, -2.5f, 3.14159f, 1e-8f, 65504.0f, 70000.0f, 0.0f, -0.0f};
  std::vector<uint16_t> bf16(src.size()), half(src.size());
  CopyRun to_bf16{src.data(), bf16.data(), static_cast<int64_t>(src.size())};
  copy_runs_cpu(&to_bf16, 1, {Element::kFloat32, Element::kBFloat16, 3.0});
  CopyRun to_half{src.data(), half.data(), static_cast<int64_t>(src.size())};
  copy_runs_cpu(&to_half, 1, {Element::kFloat32, Element::kFloat16, 1.0});
  for (size_t k = 0; k < src.size(); ++k) {
    EXPECT_EQ(bf16[k], precision::float_to_bf16_bits(precision::float_bits(src[k] * 3.0f)));
    EXPECT_EQ(half[k], precision::float_to_half_bits(precision::float_bits(src[k])));
  }
  std::vector<float> accum(src.size(), 0.25f);
  CopyRun back{bf16.data(), accum.data(), static_cast<int64_t>(src.size())};
  copy_runs_cpu(&back, 1, {Element::kBFloat16, Element::kFloat32, 0.5, true});
  for (size_t k = 0; k < src.size(); ++k) {
    const float widened = precision::bits_float(precision::bf16_to_float_bits(bf16[k]));
    EXPECT_EQ(accum[k], 0.25f + widened * 0.5f);
  }
  std::vector<double> doubles = {1.0 / 3.0, -1e300};
  std::vector<float> narrowed(2);
  CopyRun to_float{doubles.data(), narrowed.data(), 2};
  copy_runs_cpu(&to_float, 1, {Element::kFloat64, Element::kFloat32, 1.0});
  EXPECT_EQ(narrowed[0], static_cast<float>(1.0 / 3.0));
  EXPECT_TRUE(std::isinf(narrowed[1]));
  std::vector<float> zeros(5, 3.0f);
  CopyRun fill{nullptr, zeros.data(), 5};
  copy_runs_cpu(&fill, 1, {});
  EXPECT_EQ(zeros, std::vector<float>(5, 0.0f));
}

// The CUDA executor's block partition, run here as the kernel runs it: every block (tile) asks
// run_of_tile and tile_range. Catches a binary search that lands on an empty run or misses the
// last tile, and tiles that overlap, leave a gap or start off a pack boundary.
TEST(CopyTiles, EveryElementOfEveryRunBelongsToExactlyOneTile) {
  const int64_t t = kTileElements;
  const std::vector<std::vector<int64_t>> sweeps = {
      {1},
      {t},
      {t + 1},
      {0, 5},
      {5, 0},
      {0, 0, t},
      {3, 0, 0, 7},
      {t - 1, 1, 2 * t},
      {7 * t + 3, 0, 1},
      {},
  };
  std::mt19937 random(7);
  std::vector<std::vector<int64_t>> cases = sweeps;
  for (int k = 0; k < 20; ++k) {  // random lists: empty, tiny and multi-tile runs
    std::vector<int64_t> counts(1 + random() % 12);
    for (int64_t& c : counts) c = random() % 4 == 0 ? 0 : random() % (3 * t);
    cases.push_back(counts);
  }
  for (const std::vector<int64_t>& counts : cases) {
    std::vector<CopyRun> runs;
    for (int64_t c : counts) runs.push_back({nullptr, nullptr, c});
    const auto n = static_cast<int64_t>(runs.size());
    const std::vector<int64_t> starts = tile_starts_of(runs.data(), n);
    std::vector<std::vector<int>> covered(runs.size());
    for (size_t r = 0; r < runs.size(); ++r) covered[r].assign(counts[r], 0);
    for (int64_t tile = 0; tile < starts.back(); ++tile) {
      const int64_t r = run_of_tile(starts.data(), n, tile);
      ASSERT_GE(r, 0);
      ASSERT_LT(r, n);
      ASSERT_GT(counts[r], 0) << "tile " << tile << " landed on an empty run";
      const TileRange range = tile_range(counts[r], tile - starts[r]);
      EXPECT_EQ(range.begin % 8, 0);  // a pack boundary
      ASSERT_LT(range.begin, range.end);
      for (int64_t e = range.begin; e < range.end; ++e) covered[r][e] += 1;
    }
    for (size_t r = 0; r < runs.size(); ++r) {
      for (int c : covered[r]) ASSERT_EQ(c, 1) << "run " << r << " of " << counts.size();
    }
  }
}

}  // namespace
}  // namespace shardwise::sharding
