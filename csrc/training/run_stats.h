// A training loop's numbers over the ranks (collective over `group`): the mean loss of the ranks
// that computed one (all, or a pipeline's last stages), the largest of a value such as the peak
// resident memory, and the step time shardwise-train reports (the median over steps of each
// step's slowest rank, the first, warm-up step left out when there are others).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "tensor_parallel/regions.h"

namespace shardwise::training {

// The mean of `loss` over the ranks where it is defined.
double mean_loss_over_ranks(const tensor_parallel::Group& group, const torch::Tensor& loss);

// The largest `value` of any rank.
double max_over_ranks(const tensor_parallel::Group& group, double value);

// The median over `seconds` (one per step, this rank's) of the slowest rank's time.
double median_step_seconds(const tensor_parallel::Group& group, const std::vector<double>& seconds);

// This process's peak resident memory in MiB (getrusage).
double peak_rss_mib();

}  // namespace shardwise::training
