// The numbers over the ranks of run_stats.h.
#include "training/run_stats.h"

#include <sys/resource.h>

#include <cstdio>
#include <stdexcept>

namespace shardwise::training {

double mean_loss_over_ranks(const tensor_parallel::Group& group, const torch::Tensor& loss) {
  const bool has = loss.defined();
  std::vector<at::Tensor> tensors{
      torch::tensor({has ? loss.item<double>() : 0.0, has ? 1.0 : 0.0}, torch::kFloat64)};
  group->allreduce(tensors)->wait();
  return tensors[0][0].item<double>() / tensors[0][1].item<double>();
}

double max_over_ranks(const tensor_parallel::Group& group, double value) {
  std::vector<at::Tensor> tensors{torch::tensor({value}, torch::kFloat64)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  group->allreduce(tensors, options)->wait();
  return tensors[0].item<double>();
}

double median_step_seconds(const tensor_parallel::Group& group,
                           const std::vector<double>& seconds) {
  std::vector<at::Tensor> tensors{torch::tensor(seconds, torch::kFloat64)};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  group->allreduce(tensors, options)->wait();
  at::Tensor slowest = tensors[0];
  if (slowest.numel() > 1) slowest = slowest.slice(0, 1);
  return slowest.median().item<double>();
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

StepLog::StepLog(tensor_parallel::Group group, const StepLogOptions& options)
    : group_(std::move(group)), options_(options), interval_start_(Clock::now()) {
  if (options.log_every < 1) {
    throw std::invalid_argument("StepLogOptions.log_every must be positive, got " +
                                std::to_string(options.log_every));
  }
}

void StepLog::begin() { step_start_ = Clock::now(); }

std::string StepLog::end(int64_t step, const torch::Tensor& loss) {
  const auto now = Clock::now();
  step_seconds_.push_back(std::chrono::duration<double>(now - step_start_).count());
  const int64_t every = options_.log_every;
  if (step % every != 0 && step != options_.last_step) return "";
  const double mean_loss = mean_loss_over_ranks(group_, loss);
  const int64_t steps = step % every == 0 ? every : step % every;
  const double seconds = std::chrono::duration<double>(now - interval_start_).count();
  interval_start_ = Clock::now();
  if (group_->getRank() != 0) return "";
  char line[128];
  std::snprintf(line, sizeof line, "step %lld loss %.7f tokens/s %.1f",
                static_cast<long long>(step), mean_loss,
                options_.tokens_per_step * static_cast<double>(steps) / seconds);
  return line;
}

std::string StepLog::summary() const {
  const double rss = max_over_ranks(group_, peak_rss_mib());
  const double step_s = step_seconds_.empty() ? 0.0 : median_step_seconds(group_, step_seconds_);
  if (group_->getRank() != 0) return "";
  char line[160];
  std::snprintf(line, sizeof line, "summary world %d tokens/s %.1f step_s %.5f peak_rss_mib %.1f",
                group_->getSize(), step_s > 0 ? options_.tokens_per_step / step_s : 0.0, step_s,
                rss);
  return line;
}

}  // namespace shardwise::training
