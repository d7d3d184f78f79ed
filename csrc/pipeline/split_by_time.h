// Splitting a model's blocks into pipeline stages by what they cost: parameter counts, or
// forward + backward time measured on a sample batch (pipeline/partition.h cuts the costs).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace shardwise::pipeline {

// One block of the model: its forward and the parameters whose gradients timing leaves behind
// (cleared after each measurement).
struct TimedBlock {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<at::Tensor> parameters;
};

struct TimingOptions {
  int repeats = 3;  // timed runs after one warm-up; the fastest counts (the least disturbed)
  // Optional: the last block is timed with loss(output, target), as the pipeline's last stage
  // runs it; without it every group ends in output.float().sum().
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)> loss;
  at::Tensor target;
};

// Forward + backward seconds of each group of consecutive blocks (`groups`: block indices) run as
// one stage. A group's input is the previous group's output as a fresh leaf (requiring grad when
// floating), starting from `sample`. Runs under the caller's autocast, if any.
std::vector<double> group_times(const std::vector<TimedBlock>& blocks,
                                const std::vector<std::vector<int>>& groups,
                                const at::Tensor& sample,
                                const TimingOptions& options);

// Each block's own forward + backward seconds (group_times with one block a group).
std::vector<double> block_times(const std::vector<TimedBlock>& blocks,
                                const at::Tensor& sample,
                                const TimingOptions& options);

// The first block of each stage: balanced_partition over block_times, then (with `refine`)
// refine_partition timing each candidate's stages whole with group_times. Timing differs between
// processes: split on one rank and broadcast the result.
std::vector<int> split_by_time(const std::vector<TimedBlock>& blocks,
                               int num_stages,
                               const at::Tensor& sample,
                               const TimingOptions& options,
                               bool refine = true);

// The first block of each stage, balancing the blocks' parameter counts.
std::vector<int> split_by_parameters(const std::vector<std::vector<at::Tensor>>& block_parameters,
                                     int num_stages);

}  // namespace shardwise::pipeline
