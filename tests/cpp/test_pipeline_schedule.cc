// The schedule generators and the validator (torch-free): every generated schedule over a grid
// of ranks and microbatch counts (m < p included) validates, with the bubble and the stashed
// microbatches the formulas give; hand-broken schedules are rejected with the right reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>

#include "pipeline/schedule.h"
#include "pipeline/schedule_validator.h"

namespace shardwise::pipeline {
namespace {

Schedule make(ScheduleKind kind, int p, int m, int v = 1) {
  ScheduleOptions o;
  o.kind = kind;
  o.num_ranks = p;
  o.num_microbatches = m;
  o.virtual_stages = v;
  return make_schedule(o);
}

TEST(PipelineSchedule, GPipeAnd1F1BValidateWithTheTextbookBubbleAndStash) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 3 * p + 1; ++m) {
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
        const Schedule s = make(kind, p, m);
        const ValidationReport r = validate(s);
        ASSERT_TRUE(r.ok) << r.error << "\n" << to_string(s);
        CostModel rendezvous;  // these two are safe even if a send waits for its receive
        rendezvous.buffered_sends = false;
        ASSERT_TRUE(validate(s, rendezvous).ok) << to_string(s);
        // Uniform stages, F = 1, B = 2: both schedules take (m + p - 1) * 3.
        EXPECT_NEAR(r.bubble_fraction, double(p - 1) / (m + p - 1), 1e-12) << to_string(s);
        for (int rank = 0; rank < p; ++rank) {
          const int expected = kind == ScheduleKind::kGPipe ? m : std::min(m, p - rank);
          EXPECT_EQ(r.peak_in_flight[rank], expected) << "rank " << rank << "\n" << to_string(s);
        }
      }
    }
  }
}

// Per-stage costs: given as equal vectors they time the schedule as the scalars do; with the
// last stage the slowest (a GPT's head and loss), 1F1B's last stage runs back to back once
// filled, so the makespan is the fill and drain, sum_k (F_k + B_k), plus (m - 1) of the slowest
// stage's F + B (the uniform formula would give (m + p - 1) of the average stage).
TEST(PipelineValidator, PerStageCostsLetTheSlowestStageSetThePace) {
  for (int p = 2; p <= 4; ++p) {
    for (int m = p; m <= 3 * p; ++m) {
      const Schedule s = make(ScheduleKind::k1F1B, p, m);
      CostModel uniform, same, staged;
      same.stage_forward.assign(p, 1.0);
      same.stage_backward.assign(p, 2.0);
      EXPECT_DOUBLE_EQ(validate(s, same).makespan, validate(s, uniform).makespan);
      double fill = 0.0;
      for (int k = 0; k < p; ++k) {
        const double scale = k == p - 1 ? 2.5 : 1.0 + 0.1 * k;
        staged.stage_forward.push_back(scale);
        staged.stage_backward.push_back(2 * scale);
        fill += 3 * scale;
      }
      const ValidationReport r = validate(s, staged);
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_NEAR(r.makespan, fill + (m - 1) * 3 * 2.5, 1e-9) << "p " << p << " m " << m;
    }
  }
  CostModel short_by_one;
  short_by_one.stage_forward = {1.0};
  short_by_one.stage_backward = {2.0};
  const ValidationReport bad = validate(make(ScheduleKind::k1F1B, 2, 4), short_by_one);
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.error.find("stage_forward and stage_backward need one cost per stage (2)"),
            std::string::npos)
      << bad.error;
}

// ZB-H1 with F = I = W = 1 on uniform stages: the bubble is (p - 1)(F + I - W) = p - 1 time
// units against 1F1B's 3(p - 1), i.e. makespan 3m + p - 1; in-flight microbatches (forwarded,
// W not done) never exceed 1F1B's worst rank, p; every I comes before its W.
TEST(PipelineSchedule, ZeroBubbleH1ValidatesWithAThirdOf1F1BsBubble) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 3 * p + 1; ++m) {
      const Schedule s = make(ScheduleKind::kZeroBubbleH1, p, m);
      for (bool buffered : {true, false}) {
        CostModel c;
        c.buffered_sends = buffered;
        const ValidationReport r = validate(s, c);
        ASSERT_TRUE(r.ok) << r.error << "\n" << to_string(s);
        if (buffered && m >= p) {  // how the executor runs: sends complete once posted
          EXPECT_DOUBLE_EQ(r.makespan, 3.0 * m + (p - 1)) << to_string(s);
        }
        if (buffered) EXPECT_LE(r.makespan, 3.0 * (m + p - 1)) << to_string(s);  // <= 1F1B
        for (int rank = 0; rank < p; ++rank) {
          EXPECT_LE(r.peak_in_flight[rank], std::min(m, p)) << "rank " << rank;
        }
      }
      for (const auto& actions : s.ranks) {
        int inputs = 0, weights = 0;
        for (const Action& a : actions) {
          EXPECT_NE(a.kind, ActionKind::kBackward);
          inputs += a.kind == ActionKind::kBackwardInput;
          weights += a.kind == ActionKind::kBackwardWeight;
        }
        EXPECT_EQ(inputs, m);
        EXPECT_EQ(weights, m);
      }
    }
  }
}

TEST(PipelineSchedule, InterleavedValidatesForAnyMicrobatchCountAndShrinksTheBubble) {
  for (int p = 2; p <= 4; ++p) {
    for (int v = 2; v <= 3; ++v) {
      for (int m = 1; m <= 3 * p + 1; ++m) {
        const Schedule s = make(ScheduleKind::kInterleaved1F1B, p, m, v);
        EXPECT_EQ(s.num_stages, p * v);
        CostModel chunk;  // a virtual stage is 1/v of a rank's layers
        chunk.forward = 1.0 / v;
        chunk.backward = 2.0 / v;
        const ValidationReport r = validate(s, chunk);
        ASSERT_TRUE(r.ok) << r.error << "\n" << to_string(s);
        const double one_f_one_b = double(p - 1) / (m + p - 1);
        if (m % p == 0) {
          EXPECT_LT(r.bubble_fraction, one_f_one_b) << to_string(s);
        }
      }
    }
  }
}

TEST(PipelineSchedule, BadOptionsNameTheOption) {
  ScheduleOptions o;
  o.num_microbatches = 0;
  EXPECT_THROW(make_schedule(o), std::invalid_argument);
  o.num_microbatches = 2;
  o.virtual_stages = 2;  // with plain 1F1B
  try {
    make_schedule(o);
    FAIL() << "accepted virtual_stages with 1f1b";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("virtual_stages"), std::string::npos);
  }
}

ValidationReport expect_rejected(const Schedule& s, const std::string& reason) {
  const ValidationReport r = validate(s);
  EXPECT_FALSE(r.ok) << to_string(s);
  EXPECT_NE(r.error.find(reason), std::string::npos) << r.error;
  EXPECT_THROW(check_schedule(s), std::invalid_argument);
  return r;
}

TEST(PipelineValidator, RejectsAMissingRecv) {
  Schedule s = make(ScheduleKind::k1F1B, 2, 3);
  auto& rank1 = s.ranks[1];
  rank1.erase(std::find(rank1.begin(), rank1.end(), Action{ActionKind::kRecvForward, 1, 2}));
  expect_rejected(s, "missing recv");
}

// Found by tests/fuzz/fuzz_schedule_validator (its regressions/ hold the inputs): a schedule
// whose counts disagree with its lists was indexed past its end, and an action of an unknown
// kind read past the table of names.
TEST(PipelineValidator, RejectsCountsThatDisagreeWithTheListsBeforeIndexingThem) {
  Schedule s = make(ScheduleKind::k1F1B, 2, 2);
  s.ranks.pop_back();
  expect_rejected(s, "1 action lists for 2 ranks");
  for (auto [p, stages, m] : {std::tuple{0, 2, 2}, {-3, 2, 2}, {2, 0, 2}, {2, 2, -1}}) {
    Schedule bad = make(ScheduleKind::k1F1B, 2, 2);
    bad.num_ranks = p, bad.num_stages = stages, bad.num_microbatches = m;
    expect_rejected(bad, "must be at least 1");
  }
  Schedule unknown = make(ScheduleKind::k1F1B, 2, 2);
  unknown.ranks[0][0].kind = static_cast<ActionKind>(8);
  expect_rejected(unknown, "unknown kind 8");
  EXPECT_EQ(action_name(unknown.ranks[0][0]), "kind8:0.0");
}

TEST(PipelineValidator, RejectsAReorderedSend) {
  Schedule s = make(ScheduleKind::kGPipe, 2, 3);
  auto& rank0 = s.ranks[0];
  auto first = std::find(rank0.begin(), rank0.end(), Action{ActionKind::kSendForward, 0, 0});
  auto second = std::find(rank0.begin(), rank0.end(), Action{ActionKind::kSendForward, 0, 1});
  std::iter_swap(first, second);
  expect_rejected(s, "reordered");
}

TEST(PipelineValidator, RejectsABackwardBeforeItsForward) {
  Schedule s = make(ScheduleKind::k1F1B, 2, 2);
  auto& rank1 = s.ranks[1];  // last stage: F1.0 B1.0 ... -> B1.0 first
  auto f = std::find(rank1.begin(), rank1.end(), Action{ActionKind::kForward, 1, 0});
  auto b = std::find(rank1.begin(), rank1.end(), Action{ActionKind::kBackward, 1, 0});
  std::iter_swap(f, b);
  expect_rejected(s, "B1.0 on rank 1 runs before F1.0");
}

TEST(PipelineValidator, FindsACircularWaitOfRendezvousSends) {
  // Interleaved, p = 2, v = 2, m = 4: safe with buffered sends (what the executor does), but a
  // send that waited for its receive would deadlock: the validator must see both.
  const Schedule s = make(ScheduleKind::kInterleaved1F1B, 2, 4, 2);
  EXPECT_TRUE(validate(s).ok);
  CostModel rendezvous;
  rendezvous.buffered_sends = false;
  const ValidationReport r = validate(s, rendezvous);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
}

TEST(PipelineValidator, FindsACircularWait) {
  // Rank 0 waits for B1.0's gradient before sending F0.1; rank 1 waits for F0.1 before B1.0.
  using K = ActionKind;
  Schedule s;
  s.name = "hand-made";
  s.num_ranks = 2;
  s.num_stages = 2;
  s.num_microbatches = 2;
  s.ranks = {{{K::kForward, 0, 0},
              {K::kSendForward, 0, 0},
              {K::kForward, 0, 1},
              {K::kRecvBackward, 0, 0},
              {K::kBackward, 0, 0},
              {K::kSendForward, 0, 1},
              {K::kRecvBackward, 0, 1},
              {K::kBackward, 0, 1}},
             {{K::kRecvForward, 1, 0},
              {K::kForward, 1, 0},
              {K::kRecvForward, 1, 1},
              {K::kForward, 1, 1},
              {K::kBackward, 1, 0},
              {K::kSendBackward, 1, 0},
              {K::kBackward, 1, 1},
              {K::kSendBackward, 1, 1}}};
  const ValidationReport r = expect_rejected(s, "deadlock");
  EXPECT_NE(r.error.find("rank 0 at RECV_B0.0"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("rank 1 at RECV_F1.1"), std::string::npos) << r.error;
}

TEST(PipelineValidator, SplitBackwardNeedsInputGradientBeforeWeightGradient) {
  using K = ActionKind;
  Schedule s;
  s.name = "single stage";
  s.ranks = {{{K::kForward, 0, 0}, {K::kBackwardWeight, 0, 0}, {K::kBackwardInput, 0, 0}}};
  expect_rejected(s, "W0.0 on rank 0 runs before I0.0");
  s.ranks = {{{K::kForward, 0, 0}, {K::kBackwardInput, 0, 0}, {K::kBackwardWeight, 0, 0}}};
  const ValidationReport r = validate(s);
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.peak_in_flight[0], 1);
}

}  // namespace
}  // namespace shardwise::pipeline

namespace shardwise::pipeline {
namespace {

// forward_only (the evaluation schedule): catches a kept backward or gradient message, a dropped
// forward, and a forward-only order that waits in a cycle (which would hang evaluation).
TEST(PipelineSchedule, ForwardOnlySchedulesValidateWithEveryForwardOnce) {
  for (const auto& [kind, v] : {std::pair{ScheduleKind::kGPipe, 1},
                                {ScheduleKind::k1F1B, 1},
                                {ScheduleKind::kInterleaved1F1B, 2},
                                {ScheduleKind::kZeroBubbleH1, 1}}) {
    for (int p : {1, 2, 4}) {
      for (int m : {1, p + 1, 2 * p}) {
        if (kind == ScheduleKind::kInterleaved1F1B && p == 1) continue;
        const Schedule eval = forward_only(make(kind, p, m, v));
        EXPECT_TRUE(eval.forward_only);
        const ValidationReport r = validate(eval);
        EXPECT_TRUE(r.ok) << r.error << "\n" << to_string(eval);
        int forwards = 0;
        for (const auto& list : eval.ranks) {
          for (const Action& a : list) {
            EXPECT_TRUE(a.kind == ActionKind::kForward || a.kind == ActionKind::kSendForward ||
                        a.kind == ActionKind::kRecvForward)
                << action_name(a);
            forwards += a.kind == ActionKind::kForward;
          }
        }
        EXPECT_EQ(forwards, eval.num_stages * m);
      }
    }
  }
}

TEST(PipelineValidator, RejectsABackwardInAForwardOnlySchedule) {
  Schedule s = forward_only(make(ScheduleKind::kGPipe, 2, 2));
  s.ranks[1].push_back({ActionKind::kBackward, 1, 0});
  expect_rejected(s, "has a backward in a forward-only schedule");
}

}  // namespace
}  // namespace shardwise::pipeline
