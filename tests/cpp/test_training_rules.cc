// The training rules both trainers share (csrc/training): the checkpoint writer rule swept over
// world 1-8 x every (pp, tp) that divides it x the data kinds (dp replicas, fsdp shards, a hybrid
// dp x fsdp) x every placement: each distinct copy of a parameter is written by exactly one rank,
// the first of the ranks holding it. Catches a replica written twice (a checkpoint's pieces
// overlap), a piece written by nobody (a resume fails), and a writer rule that differs between the
// layouts. Then the learning-rate schedule against values worked out from its formula, and its
// errors naming the option.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "mesh/parallel_layout.h"
#include "training/checkpoint_writer.h"
#include "training/lr_schedule.h"

namespace shardwise::training {
namespace {

struct Case {
  int world, pp, tp;
  std::vector<int> data_sizes;          // outer to inner data axes
  std::vector<std::string> data_names;  // dp, fsdp, or dp then fsdp
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int world = 1; world <= 8; ++world) {
    for (int pp = 1; pp <= world; ++pp) {
      for (int tp = 1; pp * tp <= world; ++tp) {
        if (world % (pp * tp) != 0) continue;
        const int data = world / (pp * tp);
        cases.push_back({world, pp, tp, {data}, {"dp"}});
        cases.push_back({world, pp, tp, {data}, {"fsdp"}});
        for (int replicas = 2; replicas < data; ++replicas) {
          if (data % replicas == 0) {
            cases.push_back({world, pp, tp, {replicas, data / replicas}, {"dp", "fsdp"}});
          }
        }
      }
    }
  }
  return cases;
}

mesh::MeshLayout layout_of(const Case& c) {
  std::vector<int> sizes{c.pp};
  std::vector<std::string> names{"pp"};
  sizes.insert(sizes.end(), c.data_sizes.begin(), c.data_sizes.end());
  names.insert(names.end(), c.data_names.begin(), c.data_names.end());
  sizes.push_back(c.tp);
  names.push_back("tp");
  return mesh::MeshLayout(sizes, names, c.world);
}

// What rank `rank` holds of a parameter placed so: its tp shard (when split), its fsdp shard, and
// which copy of a tie (the first stage's or the last's) it holds (-1: none).
std::vector<int> holding(const mesh::MeshLayout& layout, int rank, const ParameterPlacement& p) {
  return {p.tp_split ? layout.coordinate(rank, "tp") : -1, layout.coordinate(rank, "fsdp"),
          p.tied ? 0 : layout.coordinate(rank, "pp")};
}

class WriterRule : public ::testing::TestWithParam<Case> {};

TEST_P(WriterRule, EachDistinctCopyIsWrittenByExactlyOneRankTheFirstHoldingIt) {
  const auto layout = layout_of(GetParam());
  for (bool tp_split : {false, true}) {
    for (bool tied : {false, true}) {
      const ParameterPlacement placement{tp_split, tied};
      if (tied && layout.size("pp") == 1) continue;  // a tie across stages needs two stages
      std::map<std::vector<int>, std::vector<int>> writers, holders;
      for (int rank = 0; rank < layout.world_size(); ++rank) {
        // A tied parameter lives on the first and the last stage only.
        const int stage = layout.coordinate(rank, "pp");
        if (tied && stage != 0 && stage != layout.size("pp") - 1) continue;
        const auto held = holding(layout, rank, placement);
        holders[held].push_back(rank);
        if (writes(layout, rank, placement)) writers[held].push_back(rank);
      }
      for (const auto& [held, ranks] : holders) {
        SCOPED_TRACE("tp_split " + std::to_string(tp_split) + " tied " + std::to_string(tied) +
                     " " + layout.describe());
        ASSERT_EQ(writers[held].size(), 1u);
        EXPECT_EQ(writers[held][0], ranks.front());
      }
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = "world" + std::to_string(c.world) + "_pp" + std::to_string(c.pp) + "_tp" +
                     std::to_string(c.tp);
  for (size_t i = 0; i < c.data_names.size(); ++i) {
    name += "_" + c.data_names[i] + std::to_string(c.data_sizes[i]);
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Meshes, WriterRule, ::testing::ValuesIn(all_cases()), case_name);

TEST(WriterRule, ReplicatedAxesFollowThePlacement) {
  EXPECT_EQ(replicated_axes({false, false}), (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(replicated_axes({true, false}), (std::vector<std::string>{"dp"}));
  EXPECT_EQ(replicated_axes({true, true}), (std::vector<std::string>{"dp", "pp"}));
}

TEST(WarmupCosine, RisesLinearlyThenDecaysToTheFinalRatio) {
  WarmupCosineOptions o{1e-3, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(o, 0), 0.0);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(o, 5), 5e-4);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(o, 10), 1e-3);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(o, 60), 1e-3 * (0.1 + 0.9 * 0.5));  // half way: cos(pi/2) = 0
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(o, 35), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI / 4))));
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(o, 110), 1e-4);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(o, 500), 1e-4);  // held after max_steps
  // Without a warm-up the first step is already on the cosine, just below the peak.
  WarmupCosineOptions cold{1e-3, 0, 100, 0.0};
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(cold, 0), 1e-3);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(cold, 1), 1e-3 * 0.5 * (1 + std::cos(M_PI / 100)));
  // warmup_steps == max_steps: the span is kept at 1 step, not a division by zero.
  WarmupCosineOptions all_warmup{1e-3, 10, 10, 0.1};
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(all_warmup, 10), 1e-3);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(all_warmup, 11), 1e-4);
}

TEST(WarmupCosine, BadOptionsAreNamed) {
  auto message = [](WarmupCosineOptions o, int64_t step) {
    try {
      warmup_cosine_lr(o, step);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({-1.0, 0, 10, 0.1}, 1).find("peak_lr"), std::string::npos);
  EXPECT_NE(message({1e-3, 0, 0, 0.1}, 1).find("max_steps 0"), std::string::npos);
  EXPECT_NE(message({1e-3, 20, 10, 0.1}, 1).find("warmup_steps 20"), std::string::npos);
  EXPECT_NE(message({1e-3, 0, 10, 1.5}, 1).find("final_ratio"), std::string::npos);
  EXPECT_NE(message({1e-3, 0, 10, 0.1}, -1).find("step -1"), std::string::npos);
}

}  // namespace
}  // namespace shardwise::training
