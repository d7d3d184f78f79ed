// A pipeline-parallel training step for LibTorch (and, through shardwise._C, the Python
// `shardwise.pipeline.Pipeline`): this rank's stages under a validated schedule, with the two
// things a whole model needs around the executor.
//
// step(inputs, targets) cuts both into the schedule's microbatches (at::chunk; every microbatch
// present), runs PipelineExecutor::step, then:
// - tied parameters (TiedParameter: e.g. the embedding on the first stage and the head on the
//   last) get the sum of both copies' gradients; the constructor starts stage b's copy from
//   stage a's values;
// - with a data-parallel group (the same stages on other pipelines), the replicated stages'
//   gradients are averaged over it in one all-reduce. A stage with `set_gradient_sync` (an
//   FSDP-sharded stage) reduces its own gradients instead: its sync is off during the step and
//   turned on right before its last backward, and it is left out of the average.
//
// `deterministic`: the same bits at every pipeline and data-parallel degree. Each microbatch's
// loss is divided by the global batch's microbatch count (num_microbatches x data-parallel size
// x accumulation); the microbatches' gradients are summed as the tree over the microbatch index
// (pipeline/microbatch_tree.h), then over the data-parallel ranks by the tree all-reduce
// (distributed/tree_reduce.h), without a division; clip_grad_norm_ takes the exact norm.
// Refused with it: FSDP-sharded stages, split-backward schedules (zb_h1) and a schedule whose
// backwards of a stage are not in microbatch order.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <utility>
#include <vector>

#include "pipeline/executor.h"
#include "pipeline/microbatch_tree.h"
#include "pipeline/tied_parameters.h"

namespace shardwise::pipeline {

struct PipelineStage {
  int id = 0;  // the stage's index in the schedule
  PipelineExecutor::StageFn forward;
  std::vector<std::pair<std::string, at::Tensor>> parameters;  // by name (tied lookups)
  // Optional: turns the stage's own gradient reduction on or off (FSDP-sharded stages).
  std::function<void(bool)> set_gradient_sync;
};

struct PipelineOptions {
  Schedule schedule;
  int rank = 0;                                  // this rank's index in `group`
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // the pipeline ranks; null with one rank
  // Optional: the ranks holding the same stages in the other pipelines (data parallelism).
  c10::intrusive_ptr<c10d::ProcessGroup> data_parallel_group;
  std::vector<TiedParameter> tied;
  // The last stage's loss of one microbatch (a scalar, averaged over the microbatch).
  std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)> loss;
  // Optional: runs right before each stage forward (ExecutorOptions::before_forward).
  std::function<void(int stage, int microbatch)> before_forward;
  bool deterministic = false;  // see above
  // Deterministic mode: how many step() calls make one optimizer step (the caller sums their
  // gradients as the tree over the call index, e.g. distributed::PairwiseGradients). Refused
  // other than 1 without `deterministic` (the default mode divides by num_microbatches only).
  int accumulation = 1;
};

class Pipeline {
 public:
  // `stages`: exactly the stages the schedule gives this rank. Exchanges the tied values
  // (collective over the ranks holding tied stages).
  Pipeline(std::vector<PipelineStage> stages, PipelineOptions options);
  Pipeline(const Pipeline&) = delete;  // the executor's callbacks hold `this`
  Pipeline& operator=(const Pipeline&) = delete;

  // One step: `inputs` on the rank of stage 0 and `targets` on the rank of the last stage (each
  // undefined elsewhere); rows are cut into the microbatches. Gradients accumulate into the
  // stages' parameters' .grad; the loss (the mean over microbatches) is on the last stage's rank.
  StepResult step(const at::Tensor& inputs, const at::Tensor& targets);
  // The loss of `inputs` against `targets` (placed as for step) without gradients: the
  // schedule's forwards only (PipelineExecutor::evaluate); on the last stage's rank, else 0.
  StepResult evaluate(const at::Tensor& inputs, const at::Tensor& targets);

  const Schedule& schedule() const { return options_.schedule; }
  int rank() const { return options_.rank; }
  // This rank's parameters, stage after stage (a tied pair's copies both included).
  std::vector<at::Tensor> parameters() const;
  // Scales every gradient of this pipeline by max_norm / (norm + 1e-6) when that is below 1, as
  // torch.nn.utils.clip_grad_norm_ does on the unpipelined model: the 2-norm sums the squares of
  // every stage's gradients over the pipeline group, a tied pair counted once (stage a's copy).
  // Call after step (the replicas' gradients are averaged by then). Returns the norm. Not for
  // FSDP-sharded stages (their shards' norm needs the data-parallel group too).
  double clip_grad_norm_(double max_norm);

 private:
  TiedContext tied_context() const;
  at::Tensor parameter(int stage, const std::string& name) const;
  std::vector<at::Tensor> microbatches(const at::Tensor& batch, const char* what) const;
  void average_replicated_gradients();
  void check_deterministic() const;
  void reduce_tree_sums();  // deterministic: the data-parallel tree, then the parameters' dtype

  PipelineOptions options_;
  std::vector<PipelineStage> stages_;
  std::vector<at::Tensor> targets_;  // this step's, per microbatch
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<MicrobatchTree> tree_;  // deterministic mode only
};

}  // namespace shardwise::pipeline
