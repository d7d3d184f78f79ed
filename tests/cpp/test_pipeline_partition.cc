// balanced_partition against brute force over every way to cut small random cost lists;
// refine_partition against a measured cost that is not the sum of the blocks' own costs.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "pipeline/partition.h"

namespace shardwise::pipeline {
namespace {

double largest_run(const std::vector<double>& costs, const std::vector<int>& starts) {
  double worst = 0;
  for (size_t k = 0; k < starts.size(); ++k) {
    const int end = k + 1 < starts.size() ? starts[k + 1] : static_cast<int>(costs.size());
    double sum = 0;
    for (int i = starts[k]; i < end; ++i) sum += costs[i];
    worst = std::max(worst, sum);
  }
  return worst;
}

// The best largest-run over all cuts of costs[from..] into `stages` non-empty runs.
double brute(const std::vector<double>& costs, int from, int stages) {
  const int n = static_cast<int>(costs.size());
  if (stages == 1) {
    double sum = 0;
    for (int i = from; i < n; ++i) sum += costs[i];
    return sum;
  }
  double best = 1e300, run = 0;
  for (int end = from + 1; end <= n - stages + 1; ++end) {
    run += costs[end - 1];
    best = std::min(best, std::max(run, brute(costs, end, stages - 1)));
  }
  return best;
}

TEST(PipelinePartition, MatchesBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9);
    std::vector<double> costs(n);
    for (double& c : costs) c = cost(rng);
    for (int k = 1; k <= n; ++k) {
      const std::vector<int> starts = balanced_partition(costs, k);
      ASSERT_EQ(static_cast<int>(starts.size()), k);
      EXPECT_EQ(starts[0], 0);
      for (int s = 1; s < k; ++s) EXPECT_LT(starts[s - 1], starts[s]);
      EXPECT_DOUBLE_EQ(largest_run(costs, starts), brute(costs, 0, k));
    }
  }
}

TEST(PipelinePartition, BadStageCountsAreRejected) {
  EXPECT_THROW(balanced_partition({1, 2}, 0), std::invalid_argument);
  EXPECT_THROW(balanced_partition({1, 2}, 3), std::invalid_argument);
  EXPECT_THROW(balanced_partition({1, -2}, 1), std::invalid_argument);
}

// A stage's measured time here is its blocks' sum plus 2 for every stage but the last (it
// converts its output), which the per-block costs cannot see: balanced_partition's cut [0, 4]
// (4 + 2 = 6 against 4) loses to [0, 3] (3 + 2 = 5 against 5), which the refinement finds.
TEST(PipelinePartition, RefineMovesABoundaryWhenTheWholeStageIsFaster) {
  const std::vector<double> costs{1, 1, 1, 1, 2, 2};
  const int n = static_cast<int>(costs.size());
  int calls = 0;
  auto slowest = [&](const std::vector<int>& starts) {
    ++calls;
    double worst = 0;
    for (size_t k = 0; k < starts.size(); ++k) {
      const int end = k + 1 < starts.size() ? starts[k + 1] : n;
      double sum = k + 1 < starts.size() ? 2.0 : 0.0;
      for (int i = starts[k]; i < end; ++i) sum += costs[i];
      worst = std::max(worst, sum);
    }
    return worst;
  };
  const std::vector<int> balanced = balanced_partition(costs, 2);
  ASSERT_EQ(balanced, (std::vector<int>{0, 4}));
  const std::vector<int> refined = refine_partition(balanced, n, slowest);
  EXPECT_EQ(refined, (std::vector<int>{0, 3}));
  EXPECT_EQ(slowest(refined), 5.0);
  EXPECT_EQ(calls, 1 + 2 + 2 + 1);  // the start, two rounds of two candidates, the check above
}

TEST(PipelinePartition, RefineKeepsTheCutWithoutAOnePercentGainAndKeepsStagesNonEmpty) {
  int calls = 0;
  auto flat = [&](const std::vector<int>& starts) {
    ++calls;
    for (size_t k = 1; k < starts.size(); ++k) EXPECT_LT(starts[k - 1], starts[k]);
    return 1.0;
  };
  EXPECT_EQ(refine_partition({0, 1, 2}, 3, flat), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(calls, 1);  // no boundary can move without emptying a stage
  EXPECT_EQ(refine_partition({0, 2}, 4, flat), (std::vector<int>{0, 2}));
}

TEST(PipelinePartition, StageGroupsListEachStagesBlocks) {
  EXPECT_EQ(stage_groups({0, 2, 3}, 5), (std::vector<std::vector<int>>{{0, 1}, {2}, {3, 4}}));
  EXPECT_EQ(stage_groups({0}, 2), (std::vector<std::vector<int>>{{0, 1}}));
}

}  // namespace
}  // namespace shardwise::pipeline
