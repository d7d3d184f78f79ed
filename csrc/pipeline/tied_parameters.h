// Parameters tied across two pipeline stages (the token embedding on the first stage, the head
// on the last): each stage holds its own copy, kept equal by starting stage b from stage a's
// values and, after every backward, making both gradients their sum. The optimizer then takes the
// same step on both copies, as on the one shared parameter of the unpipelined model.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "pipeline/schedule.h"

namespace shardwise::pipeline {

struct TiedParameter {
  int stage_a = 0;
  std::string name_a;  // the parameter's name in stage a
  int stage_b = 0;
  std::string name_b;  // ... and in stage b
};

// What the exchange needs of the pipeline: the schedule (which rank runs a stage), this rank in
// `group` (the pipeline ranks; null with one rank) and this rank's parameters by stage and name.
struct TiedContext {
  const Schedule* schedule = nullptr;
  int rank = 0;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::function<at::Tensor(int stage, const std::string& name)> parameter;
};

// Stage a's values into stage b's copy: one message from a's rank to b's (a copy when both stages
// are here); nothing on other ranks.
void copy_tied_values(const TiedParameter& tied, const TiedContext& context);

// Both copies' gradients := their sum (a missing gradient counts as zeros): one exchange between
// the two ranks; nothing on other ranks.
void sum_tied_gradients(const TiedParameter& tied, const TiedContext& context);

// The deterministic mode's sum (pipeline/microbatch_tree.h): `a` and `b` are stage a's and stage
// b's copy's gradients by microbatch (float32; empty for a stage not on this rank). Returns the
// balanced binary tree over the microbatch index of a[k] + b[k], the same bits on both ranks (an
// IEEE addition commutes): one exchange of the m gradients between the two ranks.
at::Tensor sum_tied_gradients_by_microbatch(const TiedParameter& tied,
                                            const TiedContext& context,
                                            const std::vector<at::Tensor>& a,
                                            const std::vector<at::Tensor>& b);

}  // namespace shardwise::pipeline
