// The numbers over the ranks of run_stats.h.
#include "training/run_stats.h"

#include <sys/resource.h>

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

}  // namespace shardwise::training
