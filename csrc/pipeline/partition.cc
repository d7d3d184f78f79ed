#include "pipeline/partition.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace shardwise::pipeline {

std::vector<int> balanced_partition(const std::vector<double>& costs, int num_stages) {
  const int n = static_cast<int>(costs.size());
  if (num_stages < 1 || num_stages > n) {
    throw std::invalid_argument("balanced_partition: num_stages " + std::to_string(num_stages) +
                                ": need 1 <= num_stages <= number of blocks (" + std::to_string(n) +
                                ")");
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    if (costs[i] < 0) throw std::invalid_argument("balanced_partition: a cost is negative");
    prefix[i + 1] = prefix[i] + costs[i];
  }
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest largest-run over the first i blocks cut into k runs; cut[k][i]: the
  // start of the k-th run in that optimum.
  std::vector<std::vector<double>> best(num_stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(num_stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= num_stages; ++k) {
    for (int i = k; i <= n; ++i) {
      for (int j = k - 1; j < i; ++j) {
        const double worst = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (worst < best[k][i]) {
          best[k][i] = worst;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> starts(num_stages);
  for (int k = num_stages, i = n; k >= 1; --k) {
    starts[k - 1] = cut[k][i];
    i = cut[k][i];
  }
  return starts;
}

std::vector<int> refine_partition(std::vector<int> starts,
                                  int num_blocks,
                                  const std::function<double(const std::vector<int>&)>& slowest,
                                  double min_gain) {
  const int stages = static_cast<int>(starts.size());
  double best_time = slowest(starts);
  for (int round = 0; round < 2 * stages; ++round) {
    std::vector<int> best_cut;
    double best_candidate = std::numeric_limits<double>::infinity();
    for (int k = 1; k < stages; ++k) {
      for (int step : {-1, 1}) {
        std::vector<int> cut = starts;
        cut[k] += step;
        const int upper = k + 1 < stages ? cut[k + 1] : num_blocks;
        if (cut[k - 1] >= cut[k] || cut[k] >= upper) continue;
        const double time = slowest(cut);
        if (time < best_candidate || (time == best_candidate && cut < best_cut)) {
          best_candidate = time;
          best_cut = cut;
        }
      }
    }
    if (best_cut.empty() || best_candidate >= (1.0 - min_gain) * best_time) break;
    best_time = best_candidate;
    starts = best_cut;
  }
  return starts;
}

std::vector<std::vector<int>> stage_groups(const std::vector<int>& starts, int num_blocks) {
  std::vector<std::vector<int>> groups;
  for (size_t k = 0; k < starts.size(); ++k) {
    const int end = k + 1 < starts.size() ? starts[k + 1] : num_blocks;
    groups.emplace_back();
    for (int i = starts[k]; i < end; ++i) groups.back().push_back(i);
  }
  return groups;
}

}  // namespace shardwise::pipeline
