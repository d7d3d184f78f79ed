// A training loop's numbers over the ranks (collective over `group`): the mean loss of the ranks
// that computed one (all, or a pipeline's last stages), the largest of a value such as the peak
// resident memory, and the step time shardwise-train reports (the median over steps of each
// step's slowest rank, the first, warm-up step left out when there are others). StepLog puts them
// together as a loop's log lines.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <string>
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

struct StepLogOptions {
  int64_t log_every = 10;      // a line every this many steps, and at the last
  int64_t last_step = 0;       // the run's last step
  double tokens_per_step = 0;  // tokens one step consumes over all data-parallel ranks
};

// A training loop's log, the lines shardwise-train prints: each step timed from begin() to end();
// every log_every steps and at the last, "step N loss L tokens/s T" (the loss averaged over the
// ranks that computed one, the tokens/s over the steps since the previous line); at the end,
// "summary world W tokens/s T step_s S peak_rss_mib R" (median_step_seconds, the largest peak
// RSS). Lines are returned on the group's rank 0 and empty elsewhere; end() on a log step and
// summary() are collective over the group.
class StepLog {
 public:
  StepLog(tensor_parallel::Group group, const StepLogOptions& options);

  void begin();
  std::string end(int64_t step, const torch::Tensor& loss);
  std::string summary() const;

 private:
  using Clock = std::chrono::steady_clock;
  tensor_parallel::Group group_;
  StepLogOptions options_;
  std::vector<double> step_seconds_;
  Clock::time_point step_start_, interval_start_;
};

}  // namespace shardwise::training
