#include "pipeline/pipeline.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "distributed/average_gradients.h"

namespace shardwise::pipeline {
namespace {

// The device of this rank's stages (their parameters'; the CPU for stages without parameters).
c10::Device stages_device(const std::vector<PipelineStage>& stages) {
  std::optional<c10::Device> device;
  for (const PipelineStage& s : stages) {
    for (const auto& [name, p] : s.parameters) {
      if (!device) device = p.device();
      TORCH_CHECK_VALUE(p.device() == *device, "Pipeline: stage ", s.id, "'s parameter ", name,
                        " is on ", p.device(), " but this rank's first parameter is on ", *device,
                        "; place all of a rank's stages on one device");
    }
  }
  return device.value_or(c10::Device(c10::kCPU));
}

}  // namespace

Pipeline::Pipeline(std::vector<PipelineStage> stages, PipelineOptions options)
    : options_(std::move(options)), stages_(std::move(stages)) {
  TORCH_CHECK_VALUE(static_cast<bool>(options_.loss), "Pipeline: a loss function is required");
  const bool sharded = std::any_of(stages_.begin(), stages_.end(), [](const PipelineStage& s) {
    return bool(s.set_gradient_sync);
  });
  TORCH_CHECK_VALUE(!(sharded && options_.schedule.name == "zb_h1"),
                    "schedule zb_h1 defers weight gradients past the backward, where FSDP reduces "
                    "them; use 1f1b (or interleaved_1f1b) for FSDP-sharded stages");
  std::sort(stages_.begin(), stages_.end(),
            [](const PipelineStage& a, const PipelineStage& b) { return a.id < b.id; });
  std::vector<int> ids;
  std::vector<PipelineExecutor::StageFn> forwards;
  for (const PipelineStage& s : stages_) {
    ids.push_back(s.id);
    forwards.push_back(s.forward);
  }
  ExecutorOptions o;
  o.schedule = options_.schedule;
  o.rank = options_.rank;
  o.group = options_.group;
  o.device = stages_device(stages_);
  o.loss = [this](const at::Tensor& output, int microbatch) {
    TORCH_CHECK_VALUE(microbatch < static_cast<int>(targets_.size()),
                      "Pipeline.step: the rank of the last stage needs targets");
    return options_.loss(output, targets_[microbatch]);
  };
  o.before_last_backward = [this](int stage) {
    for (const PipelineStage& s : stages_) {
      if (s.id == stage && s.set_gradient_sync) s.set_gradient_sync(true);
    }
  };
  executor_ = std::make_unique<PipelineExecutor>(std::move(ids), std::move(forwards), std::move(o));
  for (const TiedParameter& t : options_.tied) copy_tied_values(t, tied_context());
}

at::Tensor Pipeline::parameter(int stage, const std::string& name) const {
  for (const PipelineStage& s : stages_) {
    if (s.id != stage) continue;
    for (const auto& [n, p] : s.parameters) {
      if (n == name) return p;
    }
    TORCH_CHECK_VALUE(false, "tied parameter ", name, ": stage ", stage,
                      " has no parameter of "
                      "that name");
  }
  TORCH_CHECK_VALUE(false, "tied parameter ", name, ": stage ", stage, " is not on rank ",
                    options_.rank);
}

TiedContext Pipeline::tied_context() const {
  return {&options_.schedule, options_.rank, options_.group,
          [this](int stage, const std::string& name) { return parameter(stage, name); }};
}

std::vector<at::Tensor> Pipeline::microbatches(const at::Tensor& batch, const char* what) const {
  if (!batch.defined()) return {};
  const int m = options_.schedule.num_microbatches;
  TORCH_CHECK_VALUE(batch.dim() >= 1, "Pipeline.step: ", what, " must have a batch dimension");
  std::vector<at::Tensor> parts = batch.chunk(m);
  TORCH_CHECK_VALUE(static_cast<int>(parts.size()) == m, "Pipeline.step: ", what, ": a batch of ",
                    batch.size(0), " rows cannot make ", m, " microbatches; use a multiple of ", m,
                    " rows");
  return parts;
}

StepResult Pipeline::step(const at::Tensor& inputs, const at::Tensor& targets) {
  const std::vector<at::Tensor> chunks = microbatches(inputs, "inputs");
  targets_ = microbatches(targets, "targets");
  for (const PipelineStage& s : stages_) {
    if (s.set_gradient_sync) s.set_gradient_sync(false);  // until its last backward
  }
  StepResult result = executor_->step(chunks);
  targets_.clear();
  for (const TiedParameter& t : options_.tied) sum_tied_gradients(t, tied_context());
  average_replicated_gradients();
  return result;
}

StepResult Pipeline::evaluate(const at::Tensor& inputs, const at::Tensor& targets) {
  const std::vector<at::Tensor> chunks = microbatches(inputs, "inputs");
  targets_ = microbatches(targets, "targets");
  struct Clear {
    std::vector<at::Tensor>& targets;
    ~Clear() { targets.clear(); }
  } clear{targets_};
  return executor_->evaluate(chunks);
}

void Pipeline::average_replicated_gradients() {
  if (!options_.data_parallel_group || options_.data_parallel_group->getSize() == 1) return;
  std::vector<at::Tensor> replicated;
  for (const PipelineStage& s : stages_) {
    if (s.set_gradient_sync) continue;  // reduced in its last backward
    for (const auto& [name, p] : s.parameters) replicated.push_back(p);
  }
  distributed::average_gradients(replicated, *options_.data_parallel_group);
}

double Pipeline::clip_grad_norm_(double max_norm) {
  TORCH_CHECK_VALUE(max_norm > 0, "Pipeline.clip_grad_norm_: max_norm ", max_norm,
                    " must be positive");
  std::vector<at::Tensor> grads;
  at::Tensor total = at::zeros({1}, at::kDouble);
  for (const PipelineStage& s : stages_) {
    TORCH_CHECK_VALUE(!s.set_gradient_sync, "Pipeline.clip_grad_norm_: stage ", s.id,
                      " is FSDP-sharded; clip with its FullyShardedDataParallel instead");
    for (const auto& [name, p] : s.parameters) {
      if (!p.grad().defined()) continue;
      grads.push_back(p.grad());
      const bool duplicate = std::any_of(
          options_.tied.begin(), options_.tied.end(),
          [&](const TiedParameter& t) { return t.stage_b == s.id && t.name_b == name; });
      if (!duplicate) total += p.grad().to(at::kDouble).pow(2).sum().cpu().reshape({1});
    }
  }
  if (options_.group && options_.group->getSize() > 1) {
    std::vector<at::Tensor> tensors{total};
    options_.group->allreduce(tensors)->wait();
  }
  const double norm = std::sqrt(total.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (const at::Tensor& g : grads) g.mul_(coefficient);
  }
  return norm;
}

std::vector<at::Tensor> Pipeline::parameters() const {
  std::vector<at::Tensor> out;
  for (const PipelineStage& s : stages_) {
    for (const auto& [name, p] : s.parameters) out.push_back(p);
  }
  return out;
}

}  // namespace shardwise::pipeline
