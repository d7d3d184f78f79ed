// The schedule generators. Each orders the compute actions of every rank; lower_communication
// then puts a RECV right before the compute that needs remote data and a SEND right after the
// compute that produces it, so "send an activation, receive a gradient" lands in one group.
//
// GPipe: all forwards, then all backwards (in microbatch order).
// 1F1B: rank r runs warmup = min(p - r - 1, m) forwards, then alternates one forward and one
//   backward, then drains the remaining backwards; at most warmup + 1 microbatches in flight.
// Interleaved 1F1B (v stages per rank, stage = chunk * p + r): microbatches go in groups of p;
//   forwards run chunk 0 of a group, then chunk 1, ...; backwards the chunks in reverse; the
//   warm-up is Megatron's (p - r - 1) * 2 + (v - 1) * p chunk-forwards (plus the smallest
//   extension that validates when m is not a multiple of p), then 1F1B on chunks.
// ZB-H1: see schedule_zero_bubble.cc.
#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "pipeline/schedule.h"
#include "pipeline/schedule_validator.h"

namespace shardwise::pipeline {
namespace {

Action forward(int stage, int microbatch) { return {ActionKind::kForward, stage, microbatch}; }
Action backward(int stage, int microbatch) { return {ActionKind::kBackward, stage, microbatch}; }

std::vector<Action> gpipe_rank(int rank, int m) {
  std::vector<Action> out;
  for (int i = 0; i < m; ++i) out.push_back(forward(rank, i));
  for (int i = 0; i < m; ++i) out.push_back(backward(rank, i));
  return out;
}

// Interleaves `forwards` and `backwards` (same length) 1F1B-style after `warmup` forwards.
std::vector<Action> one_f_one_b(const std::vector<Action>& forwards,
                                const std::vector<Action>& backwards,
                                int warmup) {
  const int total = static_cast<int>(forwards.size());
  warmup = std::min(warmup, total);
  std::vector<Action> out(forwards.begin(), forwards.begin() + warmup);
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(forwards[warmup + k]);
    out.push_back(backwards[k]);
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(backwards[k]);
  return out;
}

std::vector<Action> interleaved_rank(int rank, int p, int m, int v, int extra_warmup) {
  std::vector<Action> forwards, backwards;
  for (int first = 0; first < m; first += p) {
    const int last = std::min(first + p, m);
    for (int c = 0; c < v; ++c) {
      for (int i = first; i < last; ++i) forwards.push_back(forward(c * p + rank, i));
    }
    for (int c = v - 1; c >= 0; --c) {
      for (int i = first; i < last; ++i) backwards.push_back(backward(c * p + rank, i));
    }
  }
  return one_f_one_b(forwards, backwards, (p - rank - 1) * 2 + (v - 1) * p + extra_warmup);
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

}  // namespace

bool Schedule::is_communication(const Action& action) const {
  return action.kind == ActionKind::kSendForward || action.kind == ActionKind::kRecvForward ||
         action.kind == ActionKind::kSendBackward || action.kind == ActionKind::kRecvBackward;
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved_1f1b";
    case ScheduleKind::kZeroBubbleH1:
      return "zb_h1";
  }
  return "?";
}

Schedule make_schedule(const ScheduleOptions& o) {
  require(o.num_ranks >= 1,
          "pipeline schedule: num_ranks must be >= 1, got " + std::to_string(o.num_ranks));
  require(o.num_microbatches >= 1, "pipeline schedule: num_microbatches must be >= 1, got " +
                                       std::to_string(o.num_microbatches));
  require(o.virtual_stages >= 1, "pipeline schedule: virtual_stages must be >= 1, got " +
                                     std::to_string(o.virtual_stages));
  require(o.virtual_stages == 1 || o.kind == ScheduleKind::kInterleaved1F1B,
          "pipeline schedule: virtual_stages > 1 needs the interleaved_1f1b schedule");
  Schedule s;
  s.name = schedule_name(o.kind);
  s.num_ranks = o.num_ranks;
  s.num_microbatches = o.num_microbatches;
  s.num_stages = o.num_ranks * o.virtual_stages;
  const int p = o.num_ranks, m = o.num_microbatches;
  if (o.kind == ScheduleKind::kZeroBubbleH1) {
    s.ranks = zero_bubble_h1_order(p, m);
    return lower_communication(std::move(s));
  }
  for (int r = 0; r < p; ++r) {
    switch (o.kind) {
      case ScheduleKind::kGPipe:
        s.ranks.push_back(gpipe_rank(r, m));
        break;
      case ScheduleKind::k1F1B: {
        std::vector<Action> f, b;
        for (int i = 0; i < m; ++i) f.push_back(forward(r, i)), b.push_back(backward(r, i));
        s.ranks.push_back(one_f_one_b(f, b, p - r - 1));
        break;
      }
      case ScheduleKind::kInterleaved1F1B:
        s.ranks.push_back(interleaved_rank(r, p, m, o.virtual_stages, 0));
        break;
      case ScheduleKind::kZeroBubbleH1:
        break;
    }
  }
  if (o.kind != ScheduleKind::kInterleaved1F1B) return lower_communication(std::move(s));
  // Megatron's warm-up is enough when m is a multiple of p; otherwise a partial last group can
  // wait in a cycle. Then every rank warms up `extra` chunk-forwards more, the smallest number
  // that validates (at most m * v, which is all forwards first: always valid).
  for (int extra = 0;; ++extra) {
    for (int r = 0; r < p; ++r) s.ranks[r] = interleaved_rank(r, p, m, o.virtual_stages, extra);
    Schedule lowered = lower_communication(s);
    if (validate(lowered).ok || extra >= m * o.virtual_stages) return lowered;
  }
}

// Sends go right after the compute that produces them. Receives go right before the compute
// that needs them, but a channel (rank a -> rank b) delivers in send order, so the receiver first
// receives whatever was sent on that channel before the message it needs (PyTorch's rule of
// letting the sender's order place the receiver's RECVs): channel orders then always agree.
Schedule lower_communication(Schedule s) {
  const int last = s.num_stages - 1;
  // Pass 1: the sends, and what each channel carries, in send order.
  std::map<std::pair<int, int>, std::deque<Action>> channels;  // (from, to) -> receives due
  std::vector<std::vector<Action>> with_sends(s.num_ranks);
  for (int r = 0; r < s.num_ranks; ++r) {
    for (const Action& a : s.ranks[r]) {
      with_sends[r].push_back(a);
      const bool fwd = a.kind == ActionKind::kForward;
      const bool bwd = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput;
      if (fwd && a.stage < last && s.rank_of(a.stage + 1) != r) {
        with_sends[r].push_back({ActionKind::kSendForward, a.stage, a.microbatch});
        channels[{r, s.rank_of(a.stage + 1)}].push_back(
            {ActionKind::kRecvForward, a.stage + 1, a.microbatch});
      } else if (bwd && a.stage > 0 && s.rank_of(a.stage - 1) != r) {
        with_sends[r].push_back({ActionKind::kSendBackward, a.stage, a.microbatch});
        channels[{r, s.rank_of(a.stage - 1)}].push_back(
            {ActionKind::kRecvBackward, a.stage - 1, a.microbatch});
      }
    }
  }
  // Pass 2: before a compute that needs a remote message, receive up to it on its channel.
  for (int r = 0; r < s.num_ranks; ++r) {
    std::vector<Action> out;
    for (const Action& a : with_sends[r]) {
      std::optional<std::pair<Action, int>> need;  // the receive, and the rank it comes from
      if (a.kind == ActionKind::kForward && a.stage > 0 && s.rank_of(a.stage - 1) != r) {
        need = {{ActionKind::kRecvForward, a.stage, a.microbatch}, s.rank_of(a.stage - 1)};
      } else if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) &&
                 a.stage < last && s.rank_of(a.stage + 1) != r) {
        need = {{ActionKind::kRecvBackward, a.stage, a.microbatch}, s.rank_of(a.stage + 1)};
      }
      if (need) {
        std::deque<Action>& due = channels[{need->second, r}];
        const auto it = std::find(due.begin(), due.end(), need->first);
        if (it != due.end()) {  // else already received early
          const auto stop = it + 1;
          out.insert(out.end(), due.begin(), stop);
          due.erase(due.begin(), stop);
        }
      }
      out.push_back(a);
    }
    s.ranks[r] = std::move(out);
  }
  return s;
}

std::string action_name(const Action& a) {
  static const char* names[] = {"F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};
  const int kind = static_cast<int>(a.kind);
  const std::string name = kind < 8 ? names[kind] : "kind" + std::to_string(kind) + ":";
  return name + std::to_string(a.stage) + "." + std::to_string(a.microbatch);
}

std::string to_string(const Schedule& s) {
  std::ostringstream out;
  out << s.name << ": " << s.num_ranks << " ranks, " << s.num_stages << " stages, "
      << s.num_microbatches << " microbatches\n";
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    out << "  rank " << r << ":";
    for (const Action& a : s.ranks[r]) out << " " << action_name(a);
    out << "\n";
  }
  return out.str();
}

Schedule forward_only(const Schedule& schedule) {
  Schedule out = schedule;
  out.name = schedule.name + " (forward only)";
  out.forward_only = true;
  for (auto& list : out.ranks) {
    std::vector<Action> kept;
    for (const Action& a : list) {
      if (a.kind == ActionKind::kForward || a.kind == ActionKind::kSendForward ||
          a.kind == ActionKind::kRecvForward) {
        kept.push_back(a);
      }
    }
    list = std::move(kept);
  }
  return out;
}

}  // namespace shardwise::pipeline
