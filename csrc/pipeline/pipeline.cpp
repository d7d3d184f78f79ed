#include "pipeline/pipeline.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "distributed/average_gradients.h"
#include "distributed/exact_norm.h"
#include "distributed/tree_reduce.h"

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

bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

int group_size(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  return group ? group->getSize() : 1;
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
  o.before_forward = options_.before_forward;
  o.before_last_backward = [this](int stage) {
    for (const PipelineStage& s : stages_) {
      if (s.id == stage && s.set_gradient_sync) s.set_gradient_sync(true);
    }
  };
  TORCH_CHECK_VALUE(options_.deterministic || options_.accumulation == 1, "Pipeline: accumulation ",
                    options_.accumulation,
                    " is read by the deterministic mode only; leave it at 1 "
                    "or set deterministic");
  if (options_.deterministic) {
    check_deterministic();
    o.loss_divisor = double(options_.schedule.num_microbatches) *
                     group_size(options_.data_parallel_group) * options_.accumulation;
    std::map<int, std::vector<at::Tensor>> by_stage;
    for (const PipelineStage& s : stages_) {
      for (const auto& [name, p] : s.parameters) by_stage[s.id].push_back(p);
    }
    tree_ = std::make_unique<MicrobatchTree>(std::move(by_stage), options_.tied, tied_context());
    o.after_backward = [this](int stage, int) { tree_->take(stage); };
  }
  executor_ = std::make_unique<PipelineExecutor>(std::move(ids), std::move(forwards), std::move(o));
  for (const TiedParameter& t : options_.tied) copy_tied_values(t, tied_context());
}

void Pipeline::check_deterministic() const {
  const Schedule& s = options_.schedule;
  const int replicas = group_size(options_.data_parallel_group);
  TORCH_CHECK_VALUE(options_.accumulation >= 1, "Pipeline: accumulation ", options_.accumulation,
                    " must be at least 1");
  TORCH_CHECK_VALUE(power_of_two(replicas), "Pipeline(deterministic): the data-parallel group has ",
                    replicas, " ranks; the tree over them needs a power of two");
  TORCH_CHECK_VALUE(
      power_of_two(s.num_microbatches) || (replicas == 1 && options_.accumulation == 1),
      "Pipeline(deterministic): ", s.num_microbatches,
      " microbatches; with data parallelism or "
      "accumulation the tree over the global batch needs a power of two: use 1, 2, 4, 8, ...");
  for (const PipelineStage& st : stages_) {
    TORCH_CHECK_VALUE(!st.set_gradient_sync, "Pipeline(deterministic): stage ", st.id,
                      " is FSDP-sharded; the mode covers replicated stages: drop the FSDP wrap");
  }
  for (const auto& list : s.ranks) {
    std::map<int, int> next;  // stage -> the microbatch its next backward must be
    for (const Action& a : list) {
      TORCH_CHECK_VALUE(
          a.kind != ActionKind::kBackwardInput && a.kind != ActionKind::kBackwardWeight,
          "Pipeline(deterministic): schedule ", s.name, " splits backwards (", action_name(a),
          "); use 1f1b, gpipe or interleaved_1f1b");
      if (a.kind != ActionKind::kBackward) continue;
      TORCH_CHECK_VALUE(a.microbatch == next[a.stage]++, "Pipeline(deterministic): schedule ",
                        s.name, " runs ", action_name(a),
                        " out of microbatch order; the tree "
                        "over microbatches takes them in order");
    }
  }
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
  if (tree_) {
    tree_->finish();
    reduce_tree_sums();
    return result;
  }
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

void Pipeline::reduce_tree_sums() {
  std::vector<at::Tensor> params;
  for (const PipelineStage& s : stages_) {
    for (const auto& [name, p] : s.parameters) {
      if (p.grad().defined()) params.push_back(p);
    }
  }
  if (params.empty()) return;
  if (group_size(options_.data_parallel_group) > 1) {
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : params) grads.push_back(p.grad().reshape({-1}));
    at::Tensor flat = at::cat(grads);
    distributed::tree_all_reduce_(*options_.data_parallel_group, flat);
    int64_t offset = 0;
    for (const at::Tensor& p : params) {
      at::Tensor(p).mutable_grad() = flat.narrow(0, offset, p.numel()).view(p.sizes()).clone();
      offset += p.numel();
    }
  }
  for (const at::Tensor& p : params) at::Tensor(p).mutable_grad() = p.grad().to(p.scalar_type());
}

double Pipeline::clip_grad_norm_(double max_norm) {
  TORCH_CHECK_VALUE(max_norm > 0, "Pipeline.clip_grad_norm_: max_norm ", max_norm,
                    " must be positive");
  std::vector<at::Tensor> grads, counted;  // counted: a tied pair's stage-a copy only
  for (const PipelineStage& s : stages_) {
    TORCH_CHECK_VALUE(!s.set_gradient_sync, "Pipeline.clip_grad_norm_: stage ", s.id,
                      " is FSDP-sharded; clip with its FullyShardedDataParallel instead");
    for (const auto& [name, p] : s.parameters) {
      if (!p.grad().defined()) continue;
      grads.push_back(p.grad());
      const bool duplicate = std::any_of(
          options_.tied.begin(), options_.tied.end(),
          [&](const TiedParameter& t) { return t.stage_b == s.id && t.name_b == name; });
      if (!duplicate) counted.push_back(p.grad());
    }
  }
  const bool pipelined = options_.group && options_.group->getSize() > 1;
  double norm = 0;
  if (tree_) {  // exact: the same bits however the stages split the model
    norm = distributed::exact_norm(counted, pipelined ? options_.group.get() : nullptr);
  } else {
    at::Tensor total = at::zeros({1}, at::kDouble);
    for (const at::Tensor& g : counted) {
      total += g.to(at::kDouble).pow(2).sum().cpu().reshape({1});
    }
    if (pipelined) {
      std::vector<at::Tensor> tensors{total};
      options_.group->allreduce(tensors)->wait();
    }
    norm = std::sqrt(total.item<double>());
  }
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (const at::Tensor& g : grads) at::Tensor(g).mul_(coefficient);
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
