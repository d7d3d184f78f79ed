// balanced_partition against brute force over every way to cut small random cost lists.
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

}  // namespace
}  // namespace shardwise::pipeline
