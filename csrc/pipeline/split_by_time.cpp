#include "pipeline/split_by_time.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "pipeline/partition.h"

namespace shardwise::pipeline {
namespace {

// balanced_partition with its std::invalid_argument as a ValueError-mapped c10 error.
std::vector<int> partition(const std::vector<double>& costs, int num_stages) {
  try {
    return balanced_partition(costs, num_stages);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

// Seconds of one forward + backward of `group` from `input`; `output` receives the group's output.
double time_once(const std::vector<TimedBlock>& blocks,
                 const std::vector<int>& group,
                 const at::Tensor& input,
                 bool with_loss,
                 const TimingOptions& options,
                 at::Tensor& output) {
  at::Tensor out = input.detach().requires_grad_(input.is_floating_point());
  const auto start = std::chrono::steady_clock::now();
  for (int i : group) out = blocks[i].forward(out);
  const at::Tensor scalar =
      with_loss ? options.loss(out, options.target) : out.to(at::kFloat).sum();
  if (scalar.requires_grad()) torch::autograd::backward({scalar});
  const auto seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  output = out;
  return seconds;
}

}  // namespace

std::vector<double> group_times(const std::vector<TimedBlock>& blocks,
                                const std::vector<std::vector<int>>& groups,
                                const at::Tensor& sample,
                                const TimingOptions& options) {
  TORCH_CHECK_VALUE(options.repeats >= 1, "group_times: repeats ", options.repeats,
                    " must be at least 1");
  const int n = static_cast<int>(blocks.size());
  std::vector<double> costs;
  at::Tensor x = sample;
  for (const auto& group : groups) {
    TORCH_CHECK_VALUE(!group.empty(), "group_times: a stage group is empty");
    for (int i : group) {
      TORCH_CHECK_INDEX(i >= 0 && i < n, "group_times: block ", i, " of ", n);
    }
    const bool with_loss = static_cast<bool>(options.loss) && group.back() == n - 1;
    at::Tensor out;
    double fastest = 0;
    for (int r = 0; r <= options.repeats; ++r) {  // run 0 is the warm-up
      const double seconds = time_once(blocks, group, x, with_loss, options, out);
      if (r == 1 || (r > 1 && seconds < fastest)) fastest = seconds;
    }
    for (int i : group) {
      for (const at::Tensor& p : blocks[i].parameters) {
        if (p.grad().defined()) p.mutable_grad().reset();
      }
    }
    costs.push_back(fastest);
    x = out.detach();
  }
  return costs;
}

std::vector<double> block_times(const std::vector<TimedBlock>& blocks,
                                const at::Tensor& sample,
                                const TimingOptions& options) {
  std::vector<std::vector<int>> singles;
  for (int i = 0; i < static_cast<int>(blocks.size()); ++i) singles.push_back({i});
  return group_times(blocks, singles, sample, options);
}

std::vector<int> split_by_time(const std::vector<TimedBlock>& blocks,
                               int num_stages,
                               const at::Tensor& sample,
                               const TimingOptions& options,
                               bool refine) {
  const int n = static_cast<int>(blocks.size());
  std::vector<int> starts = partition(block_times(blocks, sample, options), num_stages);
  if (!refine || num_stages == 1) return starts;
  return refine_partition(std::move(starts), n, [&](const std::vector<int>& cut) {
    const std::vector<double> times = group_times(blocks, stage_groups(cut, n), sample, options);
    return *std::max_element(times.begin(), times.end());
  });
}

std::vector<int> split_by_parameters(const std::vector<std::vector<at::Tensor>>& block_parameters,
                                     int num_stages) {
  std::vector<double> sizes;
  for (const auto& parameters : block_parameters) {
    double count = 0;
    for (const at::Tensor& p : parameters) count += static_cast<double>(p.numel());
    sizes.push_back(count);
  }
  return partition(sizes, num_stages);
}

}  // namespace shardwise::pipeline
