#include "backend/op_log.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shardwise::backend {
namespace {

constexpr size_t kKinds = 11;  // collectives::Kind's values

struct Counters {
  std::atomic<uint64_t> calls{0}, bytes{0}, ns{0};
};

std::array<Counters, kKinds>& counters() {
  static std::array<Counters, kKinds> all;
  return all;
}

struct DebugSettings {
  bool info = false;
  bool collectives = false;
};

const DebugSettings& debug() {
  static const DebugSettings settings = [] {
    DebugSettings s;
    const char* level = std::getenv("SHARDWISE_DEBUG");
    const char* subsys = std::getenv("SHARDWISE_DEBUG_SUBSYS");
    s.info =
        level != nullptr && (std::strcmp(level, "INFO") == 0 || std::strcmp(level, "TRACE") == 0);
    s.collectives =
        s.info && subsys != nullptr &&
        (std::strstr(subsys, "COLL") != nullptr || std::strstr(subsys, "ALL") != nullptr);
    return s;
  }();
  return settings;
}

}  // namespace

const char* profiling_title(c10d::OpType type) {
  using c10d::OpType;
  switch (type) {
    case OpType::BROADCAST:
      return "shardwise:broadcast";
    case OpType::ALLREDUCE:
      return "shardwise:all_reduce";
    case OpType::ALLREDUCE_COALESCED:
      return "shardwise:all_reduce_coalesced";
    case OpType::REDUCE:
      return "shardwise:reduce";
    case OpType::ALLGATHER:
      return "shardwise:all_gather";
    case OpType::_ALLGATHER_BASE:
      return "shardwise:_allgather_base";
    case OpType::ALLGATHER_COALESCED:
      return "shardwise:all_gather_coalesced";
    case OpType::GATHER:
      return "shardwise:gather";
    case OpType::SCATTER:
      return "shardwise:scatter";
    case OpType::REDUCE_SCATTER:
      return "shardwise:reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE:
      return "shardwise:_reduce_scatter_base";
    case OpType::ALLTOALL_BASE:
      return "shardwise:all_to_all";
    case OpType::ALLTOALL:
      return "shardwise:all_to_all";
    case OpType::SEND:
      return "shardwise:send";
    case OpType::RECV:
      return "shardwise:recv";
    case OpType::RECVANYSOURCE:
      return "shardwise:recvAnySource";  // gloo's spelling, which torch's tests look for
    case OpType::BARRIER:
      return "shardwise:barrier";
    default:
      return "shardwise:unknown";
  }
}

void record_op(collectives::Kind kind, int rank, uint64_t sequence, uint64_t bytes, int64_t ns) {
  const auto index = static_cast<size_t>(kind);
  if (index < kKinds) {
    Counters& c = counters()[index];
    c.calls.fetch_add(1, std::memory_order_relaxed);
    c.bytes.fetch_add(bytes, std::memory_order_relaxed);
    c.ns.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
  }
  if (debug().collectives) {
    std::fprintf(stderr, "shardwise INFO rank %d: %s #%llu %llu bytes %.1f us\n", rank,
                 collectives::kind_name(static_cast<uint32_t>(kind)),
                 static_cast<unsigned long long>(sequence), static_cast<unsigned long long>(bytes),
                 static_cast<double>(ns) * 1e-3);
  }
}

std::map<std::string, OpStats> op_stats() {
  std::map<std::string, OpStats> out;
  for (size_t k = 0; k < kKinds; ++k) {
    const Counters& c = counters()[k];
    const uint64_t calls = c.calls.load(std::memory_order_relaxed);
    if (calls == 0) continue;
    out[collectives::kind_name(static_cast<uint32_t>(k))] = {
        calls, c.bytes.load(std::memory_order_relaxed),
        static_cast<double>(c.ns.load(std::memory_order_relaxed)) * 1e-9};
  }
  return out;
}

bool debug_info() { return debug().info; }

void log_info(const std::string& line) {
  if (debug().info) std::fprintf(stderr, "shardwise INFO %s\n", line.c_str());
}

}  // namespace shardwise::backend
