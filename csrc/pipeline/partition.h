// Splitting a model into pipeline stages: contiguous runs of blocks whose largest total cost
// (parameters, or measured time) is as small as possible, since the slowest stage sets the
// pipeline's pace.
#pragma once

#include <functional>
#include <vector>

namespace shardwise::pipeline {

// The first block of each of `num_stages` non-empty contiguous runs over `costs` (one per block,
// in order, each >= 0) that minimize the largest run sum; ties go to the earliest cut. Dynamic
// programming over prefix sums: best[k][i] = min over j < i of max(best[k-1][j], sum(j..i-1)),
// O(num_stages * n^2). Throws std::invalid_argument unless 1 <= num_stages <= costs.size().
std::vector<int> balanced_partition(const std::vector<double>& costs, int num_stages);

// Settles near-ties by measurement: a stage is not the sum of its blocks (caches, casts, its
// output conversion), so `slowest(starts)` times the stages whole and returns the slowest. Each
// round tries every cut of `starts` with one boundary moved by one block either way (stages stay
// non-empty) and keeps the fastest if it beats the current by `min_gain` (a fraction), at most
// 2 * stages rounds. Returns the starts kept.
std::vector<int> refine_partition(std::vector<int> starts,
                                  int num_blocks,
                                  const std::function<double(const std::vector<int>&)>& slowest,
                                  double min_gain = 0.01);

// The block indices of each stage from the first block of each (`starts`, as above).
std::vector<std::vector<int>> stage_groups(const std::vector<int>& starts, int num_blocks);

}  // namespace shardwise::pipeline
