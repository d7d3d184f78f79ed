// Validates a schedule by simulating every rank before anything runs.
//
// The simulation executes each rank's actions in order. A compute action needs its inputs from
// actions this rank already ran (a forward needs the activation: the previous stage's forward on
// this rank or a completed RECV_F; a backward needs its forward and the output gradient: the next
// stage's backward here or a completed RECV_B; a weight gradient needs its input gradient), else
// the schedule is rejected ("B1.2 on rank 1 before F1.2"). Consecutive communication actions are
// one group: it is posted as a whole and completes once every member's partner is posted
// (with buffered sends, the default, a send needs no partner to complete), so the k-th send on a
// channel (rank a -> rank b) must be the k-th receive on it, with the same kind, stage and
// microbatch ("reordered" / "missing recv" errors otherwise). If no rank can move and some have
// actions left, the schedule deadlocks and the report lists where every rank waits.
//
// Timing uses a cost model (compute only; communication free): each action starts when its rank
// is free and its group's partners have posted. Every stage costs the same unless the model
// gives per-stage costs (stage_forward / stage_backward: stages differ, as a GPT's last stage
// holds the vocabulary's head), and then the slowest stage sets the pace. The report gives the
// makespan, the bubble fraction 1 - busy / (ranks * makespan) and, per rank, the peak number of
// stashed (forwarded, not yet backwarded) stage-microbatches.
#pragma once

#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace shardwise::pipeline {

struct CostModel {
  // true: a send completes once posted (isend, waited for at the end of the step: how the
  // executor runs); false: it completes only when its receive is posted too (rendezvous).
  bool buffered_sends = true;
  double forward = 1.0;
  double backward = 2.0;  // input + weight gradient
  double backward_input = 1.0;
  double backward_weight = 1.0;
  // Per stage (empty: the scalars above for every stage). When given, each holds one entry per
  // stage, and a stage's input and weight gradients each cost half its backward.
  std::vector<double> stage_forward;
  std::vector<double> stage_backward;
};

struct ValidationReport {
  bool ok = false;
  std::string error;  // empty when ok
  double makespan = 0.0;
  double bubble_fraction = 0.0;
  std::vector<int> peak_in_flight;  // per rank
  // Start and end time of every action, per rank, in schedule order (for timelines).
  std::vector<std::vector<std::pair<double, double>>> times;
};

ValidationReport validate(const Schedule& schedule, const CostModel& costs = {});
// validate(), throwing std::invalid_argument with the error and the printed schedule if invalid.
ValidationReport check_schedule(const Schedule& schedule, const CostModel& costs = {});

}  // namespace shardwise::pipeline
