// Pipeline schedules as data: for every rank, the ordered list of actions it runs.
//
// A model is cut into `num_stages` stages; stage s runs on rank s % num_ranks, so with
// num_stages = v * num_ranks every rank holds v "virtual" stages (interleaved schedules).
// Compute actions are forward F(s, i), backward B(s, i) of stage s on microbatch i, or the
// backward split into its input-gradient part I(s, i) and weight-gradient part W(s, i).
// Communication actions move an activation (F) or a gradient (B) between neighbouring stages on
// different ranks: SEND_F(s, i) sends stage s's output to stage s + 1, RECV_F(s, i) receives
// stage s's input from stage s - 1; SEND_B(s, i) sends the gradient of stage s's input to stage
// s - 1, RECV_B(s, i) receives the gradient of stage s's output from stage s + 1.
//
// Consecutive communication actions of a rank form one group, posted together and completed
// together (batched isend/irecv), which is what makes "send my activation, receive my gradient"
// safe against a neighbour doing the mirror image. Generators (schedule_generators.cc) order the
// compute actions and add the communication (lower_communication); the validator
// (schedule_validator.cc) simulates every rank before anything runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardwise::pipeline {

enum class ActionKind : uint8_t {
  kForward,
  kBackward,        // input and weight gradients together
  kBackwardInput,   // input gradient only (zero-bubble schedules)
  kBackwardWeight,  // weight gradient only
  kSendForward,
  kRecvForward,
  kSendBackward,
  kRecvBackward,
};

struct Action {
  ActionKind kind;
  int stage = 0;
  int microbatch = 0;
  bool operator==(const Action& other) const {
    return kind == other.kind && stage == other.stage && microbatch == other.microbatch;
  }
};

struct Schedule {
  std::string name;
  int num_ranks = 1;
  int num_stages = 1;
  int num_microbatches = 1;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: what rank r runs, in order
  // Evaluation: forwards and their activations' communication only (forward_only()); the
  // validator then requires no backward instead of one per forward.
  bool forward_only = false;

  int rank_of(int stage) const { return stage % num_ranks; }
  bool is_communication(const Action& action) const;
};

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kZeroBubbleH1 };

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int num_ranks = 1;
  int num_microbatches = 1;
  int virtual_stages = 1;  // stages per rank (interleaved only)
};

// The compute order of the chosen schedule with its communication added. Throws
// std::invalid_argument naming the bad option.
Schedule make_schedule(const ScheduleOptions& options);

// Adds SEND/RECV actions around the compute actions of `compute` (one list per rank).
Schedule lower_communication(Schedule compute);

// The evaluation schedule of a training schedule: every rank's F, SEND_F and RECV_F actions in
// their order. A forward never waits on a backward, so a schedule that runs runs without them.
Schedule forward_only(const Schedule& schedule);

// ZB-H1 (schedule_zero_bubble.cc): the compute order, one stage per rank, backwards split into
// input-gradient (I) and weight-gradient (W) actions.
std::vector<std::vector<Action>> zero_bubble_h1_order(int num_ranks, int num_microbatches);

std::string action_name(const Action& action);    // e.g. "F3.1", "SEND_B2.0"
std::string to_string(const Schedule& schedule);  // one line per rank
const char* schedule_name(ScheduleKind kind);

}  // namespace shardwise::pipeline
