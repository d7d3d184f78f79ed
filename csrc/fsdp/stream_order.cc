#include "fsdp/stream_order.h"

#include <algorithm>
#include <stdexcept>

namespace shardwise::fsdp {
namespace {

void merge(std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
  for (size_t i = 0; i < into.size(); ++i) into[i] = std::max(into[i], from[i]);
}

}  // namespace

StreamOrder::StreamOrder(std::vector<std::string> lane_names)
    : names_(std::move(lane_names)),
      clock_(names_.size(), Clock(names_.size(), 0)),
      host_(names_.size(), 0) {
  if (names_.empty()) throw std::invalid_argument("StreamOrder: lane_names is empty");
}

void StreamOrder::check_lane(int lane) const {
  if (lane < 0 || lane >= lanes()) {
    throw std::out_of_range("StreamOrder: lane " + std::to_string(lane) + " is outside [0, " +
                            std::to_string(lanes()) + ")");
  }
}

int StreamOrder::record(int lane) {
  check_lane(lane);
  events_.push_back(clock_[lane]);
  return static_cast<int>(events_.size()) - 1;
}

void StreamOrder::wait(int lane, int event) {
  check_lane(lane);
  if (event < 0 || event >= static_cast<int>(events_.size())) {
    throw std::out_of_range("StreamOrder: no event " + std::to_string(event));
  }
  merge(clock_[lane], events_[event]);
}

void StreamOrder::host_wait(int event) {
  if (event < 0 || event >= static_cast<int>(events_.size())) {
    throw std::out_of_range("StreamOrder: no event " + std::to_string(event));
  }
  merge(host_, events_[event]);
}

void StreamOrder::allocate(Buffer buffer, int lane, const std::string& name) {
  check_lane(lane);
  State state;
  state.name = name;
  state.lane = lane;
  buffers_[buffer] = std::move(state);  // a new allocation: the old history ends with the free
}

bool StreamOrder::ordered(const Use& use, const Clock& clock) const {
  return clock[use.lane] >= use.stamp;
}

std::string StreamOrder::describe(const Use& use) const {
  return "'" + use.what + "' on " + names_[use.lane];
}

StreamOrder::State* StreamOrder::live_state(Buffer buffer, const std::string& what, int lane) {
  auto it = buffers_.find(buffer);
  if (it == buffers_.end()) {
    errors_.push_back("unknown buffer: '" + what + "' on " + names_[lane] +
                      " touches a buffer that was never allocated");
    return nullptr;
  }
  if (!it->second.live) {
    errors_.push_back("use after free: '" + what + "' on " + names_[lane] + " touches '" +
                      it->second.name + "' after the host freed it");
    return nullptr;
  }
  return &it->second;
}

void StreamOrder::access(int lane,
                         const std::string& what,
                         const std::vector<Buffer>& reads,
                         const std::vector<Buffer>& writes) {
  check_lane(lane);
  ++operations_;
  Clock& clock = clock_[lane];
  merge(clock, host_);  // the host queued this after everything it had waited for
  const Use use{lane, ++clock[lane], what};
  auto race = [&](const Use& earlier, const State& state, const char* kind) {
    errors_.push_back("race on '" + state.name + "': " + kind + " " + describe(use) +
                      " is not ordered after " + describe(earlier) +
                      "; record an event there and wait for it on " + names_[lane]);
  };
  for (Buffer buffer : reads) {
    State* state = live_state(buffer, what, lane);
    if (state && state->last_write && !ordered(*state->last_write, clock)) {
      race(*state->last_write, *state, "read by");
    }
  }
  for (Buffer buffer : writes) {
    State* state = live_state(buffer, what, lane);
    if (!state) continue;
    if (state->last_write && !ordered(*state->last_write, clock)) {
      race(*state->last_write, *state, "write by");
    }
    for (const Use& read : state->reads) {
      if (!ordered(read, clock)) race(read, *state, "write by");
    }
  }
  for (Buffer buffer : reads) {
    auto it = buffers_.find(buffer);
    if (it == buffers_.end() || !it->second.live) continue;
    it->second.reads.push_back(use);
    it->second.last_use[lane] = use;
  }
  for (Buffer buffer : writes) {
    auto it = buffers_.find(buffer);
    if (it == buffers_.end() || !it->second.live) continue;
    it->second.last_write = use;
    it->second.reads.clear();
    it->second.last_use[lane] = use;
  }
}

void StreamOrder::keep_alive(Buffer buffer, int lane) {
  check_lane(lane);
  auto it = buffers_.find(buffer);
  if (it == buffers_.end() || !it->second.live) return;
  it->second.kept[lane] = clock_[lane][lane];
}

void StreamOrder::free(Buffer buffer) {
  auto it = buffers_.find(buffer);
  if (it == buffers_.end()) return;
  State& state = it->second;
  if (!state.live) {
    errors_.push_back("double free of '" + state.name + "'");
    return;
  }
  const Clock& reuse = clock_[state.lane];  // a reuse on the allocation lane comes after this
  for (const auto& [lane, use] : state.last_use) {
    if (lane == state.lane || ordered(use, reuse) || ordered(use, host_)) continue;
    auto kept = state.kept.find(lane);
    if (kept != state.kept.end() && kept->second >= use.stamp) continue;
    errors_.push_back("early reuse of '" + state.name + "' (allocated on " + names_[state.lane] +
                      "): freed while " + describe(use) + " may still run; keep it alive for " +
                      names_[lane] + " (record_stream) or make " + names_[state.lane] +
                      " wait for it");
  }
  state.live = false;
}

}  // namespace shardwise::fsdp
