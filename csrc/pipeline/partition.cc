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

}  // namespace shardwise::pipeline
