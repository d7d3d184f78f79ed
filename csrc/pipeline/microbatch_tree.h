// The deterministic mode's gradient sums of a pipeline (PipelineOptions::deterministic): the
// same bits whatever the pipeline and data-parallel degrees, as the unpipelined model's
// deterministic training step gives (distributed/tree_reduce.h).
//
// Autograd's running `+=` over a step's microbatches associates the sum in schedule order. Here
// take(stage) runs right after each backward of `stage` (microbatches in ascending order, which
// the Pipeline checks of the schedule): it moves the stage's gradients out of `.grad`, widened
// to float32, into that stage's PairwiseGradients, the balanced binary tree over the microbatch
// index. A tied copy's gradients (the embedding on the first stage, the head on the last) are
// kept per microbatch instead: the unpipelined model adds a microbatch's two contributions
// before anything else, so finish() first adds the two copies' gradients microbatch by
// microbatch (pipeline/tied_parameters.h), then runs the tree. finish() leaves the float32 sums
// in `.grad` for the data-parallel tree all-reduce and the cast to the parameters' dtype.
//
// Memory: the tree holds at most log2(m) + 1 partial sums per stage; a tied copy keeps its m
// microbatch gradients until the step's end.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <vector>

#include "distributed/tree_reduce.h"
#include "pipeline/tied_parameters.h"

namespace shardwise::pipeline {

class MicrobatchTree {
 public:
  // This rank's parameters by stage id, and the tied pairs (their copies on this rank are found
  // through `context`).
  MicrobatchTree(std::map<int, std::vector<at::Tensor>> parameters,
                 std::vector<TiedParameter> tied,
                 TiedContext context);

  // Right after the backward of `stage` for its next microbatch: its gradients taken (a missing
  // one as zeros), `.grad` left undefined.
  void take(int stage);
  // After the step's last backward: every parameter's `.grad` := its float32 sum over the
  // microbatches (tied pairs: both copies the tree of the per-microbatch sums). Then empty.
  void finish();

 private:
  struct Copy {
    int tie = 0;  // index into tied_
    bool is_a = false;
    at::Tensor parameter;
    std::vector<at::Tensor> by_microbatch;
  };
  std::map<int, std::vector<at::Tensor>> parameters_;  // without the tied copies
  std::map<int, std::vector<Copy>> copies_;            // by stage
  std::map<int, distributed::PairwiseGradients> trees_;
  std::vector<TiedParameter> tied_;
  TiedContext context_;
};

}  // namespace shardwise::pipeline
