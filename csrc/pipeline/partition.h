// Splitting a model into pipeline stages: contiguous runs of blocks whose largest total cost
// (parameters, or measured time) is as small as possible, since the slowest stage sets the
// pipeline's pace.
#pragma once

#include <vector>

namespace shardwise::pipeline {

// The first block of each of `num_stages` non-empty contiguous runs over `costs` (one per block,
// in order, each >= 0) that minimize the largest run sum; ties go to the earliest cut. Dynamic
// programming over prefix sums: best[k][i] = min over j < i of max(best[k-1][j], sum(j..i-1)),
// O(num_stages * n^2). Throws std::invalid_argument unless 1 <= num_stages <= costs.size().
std::vector<int> balanced_partition(const std::vector<double>& costs, int num_stages);

}  // namespace shardwise::pipeline
