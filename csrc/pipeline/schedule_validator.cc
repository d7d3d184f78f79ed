#include "pipeline/schedule_validator.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

namespace shardwise::pipeline {
namespace {

using Key = std::tuple<int, int, int>;  // kind, stage, microbatch

struct Channel {  // the communication actions of one direction a -> b, in program order
  std::vector<std::pair<int, int>> sends;  // (rank a, index in its list)
  std::vector<std::pair<int, int>> recvs;  // (rank b, index)
};

bool is_send(ActionKind k) {
  return k == ActionKind::kSendForward || k == ActionKind::kSendBackward;
}

// The rank at the other end of a communication action.
int peer_of(const Schedule& s, const Action& a) {
  switch (a.kind) {
    case ActionKind::kSendForward:
      return s.rank_of(a.stage + 1);
    case ActionKind::kRecvForward:
      return s.rank_of(a.stage - 1);
    case ActionKind::kSendBackward:
      return s.rank_of(a.stage - 1);
    default:
      return s.rank_of(a.stage + 1);  // kRecvBackward
  }
}

// What the partner of `a` must be: SEND_F(s) <-> RECV_F(s + 1), SEND_B(s) <-> RECV_B(s - 1).
Action partner_of(const Action& a) {
  switch (a.kind) {
    case ActionKind::kSendForward:
      return {ActionKind::kRecvForward, a.stage + 1, a.microbatch};
    case ActionKind::kRecvForward:
      return {ActionKind::kSendForward, a.stage - 1, a.microbatch};
    case ActionKind::kSendBackward:
      return {ActionKind::kRecvBackward, a.stage - 1, a.microbatch};
    default:
      return {ActionKind::kSendBackward, a.stage + 1, a.microbatch};
  }
}

std::string where(int rank, const Action& a) {
  return action_name(a) + " on rank " + std::to_string(rank);
}

class Simulator {
 public:
  Simulator(const Schedule& s, const CostModel& c) : s_(s), costs_(c) {}
  ValidationReport run();

 private:
  std::string check_structure();
  std::string match_channels();
  std::string run_compute(int r, const Action& a);
  bool try_group(int r);
  double cost(const Action& a) const;
  bool done(int r, ActionKind k, int stage, int mb) const {
    return done_[r].count({static_cast<int>(k), stage, mb}) > 0;
  }

  const Schedule& s_;
  CostModel costs_;
  std::vector<size_t> pc_;
  std::vector<double> clock_;
  std::vector<std::set<Key>> done_;
  std::vector<std::vector<int>> partner_;    // per rank, per action: partner's rank * 2^20 + index
  std::vector<std::vector<double>> posted_;  // post time of each action (< 0: not posted)
  std::vector<int> in_flight_;
  bool posted_new_ = false;  // a group was posted in this sweep (its partners may now complete)
  ValidationReport report_;
};

double Simulator::cost(const Action& a) const {
  const bool staged = !costs_.stage_forward.empty();
  const auto at = static_cast<size_t>(a.stage);
  switch (a.kind) {
    case ActionKind::kForward:
      return staged ? costs_.stage_forward[at] : costs_.forward;
    case ActionKind::kBackward:
      return staged ? costs_.stage_backward[at] : costs_.backward;
    case ActionKind::kBackwardInput:
      return staged ? costs_.stage_backward[at] / 2 : costs_.backward_input;
    case ActionKind::kBackwardWeight:
      return staged ? costs_.stage_backward[at] / 2 : costs_.backward_weight;
    default:
      return 0.0;
  }
}

// Every rank runs only its own stages; every (stage, microbatch) has one forward and one
// backward (B, or I and W), or none in a forward-only schedule.
std::string Simulator::check_structure() {
  std::map<Key, int> count;
  for (int r = 0; r < s_.num_ranks; ++r) {
    for (const Action& a : s_.ranks[r]) {
      if (a.stage < 0 || a.stage >= s_.num_stages || a.microbatch < 0 ||
          a.microbatch >= s_.num_microbatches) {
        return where(r, a) + " is out of range";
      }
      if (s_.rank_of(a.stage) != r)
        return where(r, a) + ": stage " + std::to_string(a.stage) + " lives on rank " +
               std::to_string(s_.rank_of(a.stage));
      if (!s_.is_communication(a)) ++count[{static_cast<int>(a.kind), a.stage, a.microbatch}];
    }
  }
  for (int st = 0; st < s_.num_stages; ++st) {
    for (int i = 0; i < s_.num_microbatches; ++i) {
      auto n = [&](ActionKind k) { return count[{static_cast<int>(k), st, i}]; };
      const std::string what = std::to_string(st) + "." + std::to_string(i);
      if (n(ActionKind::kForward) != 1)
        return "F" + what + " runs " + std::to_string(n(ActionKind::kForward)) +
               " times, expected once";
      const int b = n(ActionKind::kBackward), in = n(ActionKind::kBackwardInput),
                w = n(ActionKind::kBackwardWeight);
      if (s_.forward_only && b + in + w != 0) {
        return "stage-microbatch " + what + " has a backward in a forward-only schedule";
      }
      if (!s_.forward_only && !((b == 1 && in == 0 && w == 0) || (b == 0 && in == 1 && w == 1))) {
        return "stage-microbatch " + what + " needs one B, or one I and one W";
      }
    }
  }
  return "";
}

// Pairs the k-th send of each channel with its k-th receive and checks that they agree.
std::string Simulator::match_channels() {
  std::map<std::pair<int, int>, Channel> channels;
  partner_.assign(s_.num_ranks, {});
  for (int r = 0; r < s_.num_ranks; ++r) {
    partner_[r].assign(s_.ranks[r].size(), -1);
    for (size_t k = 0; k < s_.ranks[r].size(); ++k) {
      const Action& a = s_.ranks[r][k];
      if (!s_.is_communication(a)) continue;
      const int peer = peer_of(s_, a);
      if (is_send(a.kind)) {
        channels[{r, peer}].sends.push_back({r, static_cast<int>(k)});
      } else {
        channels[{peer, r}].recvs.push_back({r, static_cast<int>(k)});
      }
    }
  }
  for (const auto& [ends, ch] : channels) {
    const std::string name =
        "channel rank " + std::to_string(ends.first) + " -> rank " + std::to_string(ends.second);
    const size_t n = std::min(ch.sends.size(), ch.recvs.size());
    for (size_t k = 0; k < n; ++k) {
      const Action& send = s_.ranks[ch.sends[k].first][ch.sends[k].second];
      const Action& recv = s_.ranks[ch.recvs[k].first][ch.recvs[k].second];
      if (!(partner_of(send) == recv)) {
        return name + ": send #" + std::to_string(k) + " is " + action_name(send) +
               " but receive #" + std::to_string(k) + " is " + action_name(recv) +
               " (reordered or mismatched communication)";
      }
      partner_[ch.sends[k].first][ch.sends[k].second] =
          (ch.recvs[k].first << 20) | ch.recvs[k].second;
      partner_[ch.recvs[k].first][ch.recvs[k].second] =
          (ch.sends[k].first << 20) | ch.sends[k].second;
    }
    if (ch.sends.size() != ch.recvs.size()) {
      const bool more_sends = ch.sends.size() > ch.recvs.size();
      const auto& extra = more_sends ? ch.sends[n] : ch.recvs[n];
      return name + ": " + where(extra.first, s_.ranks[extra.first][extra.second]) +
             (more_sends ? " has no matching receive (missing recv)"
                         : " has no matching send (missing send)");
    }
  }
  return "";
}

// Runs compute action `a` of rank r if its inputs are ready; returns an error otherwise.
std::string Simulator::run_compute(int r, const Action& a) {
  const int st = a.stage, i = a.microbatch, last = s_.num_stages - 1;
  auto have = [&](ActionKind k, int stage) { return done(r, k, stage, i); };
  auto grad_done = [&](int stage) {
    return have(ActionKind::kBackward, stage) || have(ActionKind::kBackwardInput, stage);
  };
  std::string missing;
  if (a.kind == ActionKind::kForward) {
    if (st > 0 && !have(ActionKind::kForward, st - 1) && !have(ActionKind::kRecvForward, st)) {
      missing = "its input (F" + std::to_string(st - 1) + "." + std::to_string(i) + " or RECV_F)";
    }
  } else if (a.kind == ActionKind::kBackwardWeight) {
    if (!have(ActionKind::kBackwardInput, st))
      missing = "I" + std::to_string(st) + "." + std::to_string(i);
  } else {
    if (!have(ActionKind::kForward, st)) {
      missing = "F" + std::to_string(st) + "." + std::to_string(i);
    } else if (st < last && !grad_done(st + 1) && !have(ActionKind::kRecvBackward, st)) {
      missing = "its output gradient (B" + std::to_string(st + 1) + "." + std::to_string(i) +
                " or RECV_B)";
    }
  }
  if (!missing.empty()) return where(r, a) + " runs before " + missing;
  done_[r].insert({static_cast<int>(a.kind), st, i});
  const double start = clock_[r];
  clock_[r] += cost(a);
  report_.times[r].push_back({start, clock_[r]});
  if (a.kind == ActionKind::kForward) ++in_flight_[r];
  if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --in_flight_[r];
  report_.peak_in_flight[r] = std::max(report_.peak_in_flight[r], in_flight_[r]);
  return "";
}

// Posts rank r's next communication group; completes it if every partner is posted.
bool Simulator::try_group(int r) {
  const auto& list = s_.ranks[r];
  size_t end = pc_[r];
  while (end < list.size() && s_.is_communication(list[end])) ++end;
  double ready = clock_[r];
  bool complete = true;
  for (size_t k = pc_[r]; k < end; ++k) {
    if (posted_[r][k] < 0) {
      posted_[r][k] = clock_[r];
      posted_new_ = true;
    }
    if (costs_.buffered_sends && is_send(list[k].kind)) continue;
    const int peer = partner_[r][k] >> 20, index = partner_[r][k] & ((1 << 20) - 1);
    if (posted_[peer][index] < 0) {
      complete = false;
    } else {
      ready = std::max(ready, posted_[peer][index]);
    }
  }
  if (!complete) return false;
  for (size_t k = pc_[r]; k < end; ++k) {
    const Action& a = list[k];
    done_[r].insert({static_cast<int>(a.kind), a.stage, a.microbatch});
    report_.times[r].push_back({ready, ready});
  }
  clock_[r] = ready;
  pc_[r] = end;
  return true;
}

// The counts every later check indexes by; a schedule given by a user may have any.
std::string check_counts(const Schedule& s) {
  if (s.num_ranks < 1 || s.num_stages < 1 || s.num_microbatches < 1) {
    return "num_ranks, num_stages and num_microbatches must be at least 1 (got " +
           std::to_string(s.num_ranks) + ", " + std::to_string(s.num_stages) + ", " +
           std::to_string(s.num_microbatches) + ")";
  }
  if (static_cast<int64_t>(s.ranks.size()) != s.num_ranks) {
    return "the schedule has " + std::to_string(s.ranks.size()) + " action lists for " +
           std::to_string(s.num_ranks) + " ranks";
  }
  for (const auto& actions : s.ranks) {
    for (const Action& a : actions) {
      if (static_cast<int>(a.kind) > static_cast<int>(ActionKind::kRecvBackward)) {
        return "an action has the unknown kind " + std::to_string(static_cast<int>(a.kind));
      }
    }
  }
  return "";
}

ValidationReport Simulator::run() {
  if (std::string error = check_counts(s_); !error.empty()) {
    report_.error = error;
    return report_;
  }
  const auto stages = static_cast<size_t>(s_.num_stages);
  const bool staged = !costs_.stage_forward.empty() || !costs_.stage_backward.empty();
  if (staged && (costs_.stage_forward.size() != stages || costs_.stage_backward.size() != stages)) {
    report_.error = "the cost model's stage_forward and stage_backward need one cost per stage (" +
                    std::to_string(stages) + "), got " +
                    std::to_string(costs_.stage_forward.size()) + " and " +
                    std::to_string(costs_.stage_backward.size());
    return report_;
  }
  const int p = s_.num_ranks;
  report_.peak_in_flight.assign(p, 0);
  report_.times.assign(p, {});
  std::string error = check_structure();
  if (error.empty()) error = match_channels();
  pc_.assign(p, 0);
  clock_.assign(p, 0.0);
  done_.assign(p, {});
  in_flight_.assign(p, 0);
  posted_.assign(p, {});
  for (int r = 0; r < p && error.empty(); ++r) posted_[r].assign(s_.ranks[r].size(), -1.0);
  for (bool progress = true; error.empty() && progress;) {
    progress = false;
    posted_new_ = false;
    for (int r = 0; r < p && error.empty(); ++r) {
      while (pc_[r] < s_.ranks[r].size() && error.empty()) {
        const Action& a = s_.ranks[r][pc_[r]];
        if (s_.is_communication(a)) {
          if (!try_group(r)) break;
        } else {
          error = run_compute(r, a);
          if (error.empty()) ++pc_[r];
        }
        progress = true;
      }
    }
    progress = progress || posted_new_;
  }
  std::string waits;
  for (int r = 0; r < p && error.empty(); ++r) {
    if (pc_[r] < s_.ranks[r].size())
      waits += " rank " + std::to_string(r) + " at " + action_name(s_.ranks[r][pc_[r]]) + ";";
  }
  if (error.empty() && !waits.empty()) error = "deadlock: no rank can move:" + waits;
  report_.ok = error.empty();
  report_.error = error;
  double busy = 0.0;
  for (int r = 0; r < p; ++r) {
    report_.makespan = std::max(report_.makespan, clock_[r]);
    for (const Action& a : s_.ranks[r]) busy += cost(a);
  }
  if (report_.makespan > 0) report_.bubble_fraction = 1.0 - busy / (p * report_.makespan);
  return report_;
}

}  // namespace

ValidationReport validate(const Schedule& schedule, const CostModel& costs) {
  return Simulator(schedule, costs).run();
}

ValidationReport check_schedule(const Schedule& schedule, const CostModel& costs) {
  ValidationReport report = validate(schedule, costs);
  if (!report.ok) {
    throw std::invalid_argument("invalid pipeline schedule: " + report.error + "\n" +
                                to_string(schedule));
  }
  return report;
}

}  // namespace shardwise::pipeline
