// What the shardwise backend reports about its operations: the profiler name of each (as gloo's
// "gloo:all_reduce", here "shardwise:all_reduce"), counters per kind (calls, payload bytes,
// seconds: training.profile_communication reads them), and SHARDWISE_DEBUG logging in the manner
// of NCCL_DEBUG: SHARDWISE_DEBUG=INFO prints each backend's set-up to stderr, and with
// SHARDWISE_DEBUG_SUBSYS=COLL (or ALL) one line per completed operation: the rank, the kind, the
// sequence number, the bytes and the time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "collectives/transport.h"

namespace shardwise::backend {

struct OpStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;  // payload: the operation's output tensors
  double seconds = 0.0;
};

// The name torch.profiler shows for an operation of `type` ("shardwise:all_reduce"); static.
const char* profiling_title(c10d::OpType type);

// Counts one completed operation of `kind` (thread-safe) and logs it when asked.
void record_op(collectives::Kind kind, int rank, uint64_t sequence, uint64_t bytes, int64_t ns);

// Totals per kind name since the process started (kinds never run are left out).
std::map<std::string, OpStats> op_stats();

// SHARDWISE_DEBUG is INFO (or TRACE): set-up lines; log_info prints "shardwise INFO <line>".
bool debug_info();
void log_info(const std::string& line);

}  // namespace shardwise::backend
