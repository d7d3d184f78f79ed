// Runs a validated pipeline schedule on this rank's stages, usable from LibTorch.
//
// step(inputs) walks this rank's action list (evaluate(inputs) its forward-only list). F(s, i) runs
// stage s on microbatch i: stage 0 reads inputs[i]; another stage reads the activation it received
// (or, when stage s - 1 is on this rank too, that stage's output), as a leaf that requires grad.
// The last stage turns its output into loss_fn(output, i) / m, so the gradients summed over the m
// backwards are those of the mean loss, scaled exactly once. B(s, i) runs autograd from the stashed
// output with the received gradient (the last stage from its loss) and frees the microbatch's
// stash; the gradient of the stage input is what SEND_B sends upstream. Gradients accumulate in
// `.grad` over the microbatches; `before_last_backward(stage)` runs right before each stage's last
// backward of the step (where a data-parallel or FSDP wrapper enables its gradient sync).
//
// Split backwards (zero-bubble schedules): I(s, i) is B(s, i) with the executor's
// WeightGradStore deferring, so layers built on deferred_linear queue their weight gradients
// instead of computing them; W(s, i) runs what I(s, i) queued. The microbatch stays stashed
// (counted in peak_stashed) until its W. Layers that do not defer compute everything in I.
//
// Communication: a group of consecutive SEND/RECV actions is posted together. A message is a
// header (dtype, rank of the tensor, sizes) followed by the tensor, so shapes and dtypes are
// learned at run time and may change from step to step. Sends are waited for at the end of the
// step (the validator's buffered-send model); receives before the compute that needs them.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "pipeline/deferred_linear.h"
#include "pipeline/schedule.h"

namespace shardwise::pipeline {

struct ExecutorOptions {
  Schedule schedule;  // validated by the constructor
  int rank = 0;       // this rank's index in the pipeline (and in `group`)
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // the pipeline ranks; null when num_ranks = 1
  // Where this rank's stages run: received activations and gradients are placed there (so a
  // CUDA tensor sent by a peer is received as one, through the same transport).
  c10::Device device = c10::kCPU;
  // The last stage's loss for microbatch i from its output (a scalar, averaged over the
  // microbatch); the executor divides it by the number of microbatches.
  std::function<at::Tensor(const at::Tensor& output, int microbatch)> loss;
  // Optional: runs right before the last backward of each stage in the step (where a
  // data-parallel or FSDP wrapper of that stage turns its gradient sync back on).
  std::function<void(int stage)> before_last_backward;
  // Optional: runs right before each forward F(s, i) (where a caller seeds the randomness of
  // stage s for microbatch i, e.g. dropout by microbatch rather than by rank).
  std::function<void(int stage, int microbatch)> before_forward;
  // Optional: runs right after each backward B(s, i) (the deterministic mode takes microbatch
  // i's gradients of stage s there: pipeline/microbatch_tree.h).
  std::function<void(int stage, int microbatch)> after_backward;
  // The loss of each microbatch is divided by this in step(); 0: by the number of microbatches
  // (the mean over this step's; evaluate() always). The deterministic mode divides by the
  // global batch's microbatch count.
  double loss_divisor = 0;
};

struct StepResult {
  double loss = 0.0;  // mean loss over the microbatches (on the last stage's rank; else 0)
  // Measured start and end (seconds since the step began) of each action of this rank.
  std::vector<std::pair<double, double>> times;
  int peak_stashed = 0;  // most microbatch-stages stashed at once on this rank
  // Each microbatch's loss before the division, by microbatch (on the last stage's rank; else
  // empty): what an exact sum over a global batch adds up.
  std::vector<double> losses;
};

class PipelineExecutor {
 public:
  using StageFn = std::function<at::Tensor(const at::Tensor&)>;
  // `stages[k]` runs stage `stage_ids[k]`; this rank must hold exactly the stages the schedule
  // gives it.
  PipelineExecutor(std::vector<int> stage_ids,
                   std::vector<StageFn> stages,
                   ExecutorOptions options);

  // One training step over the microbatches `inputs` (used on the rank of stage 0).
  StepResult step(const std::vector<at::Tensor>& inputs);
  // The loss of `inputs` without gradients: the schedule's forward_only() actions under
  // no-grad, each activation freed once it is sent or consumed. No gradient is touched.
  StepResult evaluate(const std::vector<at::Tensor>& inputs);
  const Schedule& schedule() const { return options_.schedule; }

 private:
  struct Stash {
    at::Tensor input, output, loss, input_grad, output_grad;
  };
  Stash& stash(int stage, int microbatch);
  void forward(const Action& a, const std::vector<at::Tensor>& inputs, StepResult& result);
  void backward(const Action& a);
  void backward_weight(const Action& a);
  StepResult run(const std::vector<Action>& list, const std::vector<at::Tensor>& inputs);
  void run_group(const std::vector<Action>& list, size_t begin, size_t end);
  void send(const at::Tensor& tensor, int peer);
  at::Tensor receive(int peer);

  ExecutorOptions options_;
  Schedule evaluation_;      // forward_only(options_.schedule)
  bool evaluating_ = false;  // in evaluate(): no grad, stashes freed as soon as they are used
  std::vector<int> stage_ids_;
  std::vector<StageFn> stages_;
  std::map<std::pair<int, int>, Stash> stash_;
  std::vector<c10::intrusive_ptr<c10d::Work>> pending_sends_;
  std::vector<at::Tensor> sent_;        // kept alive until their sends complete
  std::vector<size_t> last_backwards_;  // per stage of this rank, its last backward's index
  c10::intrusive_ptr<WeightGradStore> weight_grads_ = c10::make_intrusive<WeightGradStore>();
  // (stage, microbatch) -> the weight-gradient work its I deferred, run by its W.
  std::map<std::pair<int, int>, std::vector<std::function<void()>>> deferred_;
  int stashed_ = 0;
};

}  // namespace shardwise::pipeline
