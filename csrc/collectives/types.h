// Element types, reduce operations and the options every collective takes, torch-free.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/transport.h"

namespace shardwise::collectives {

enum class Datatype : uint8_t {
  kFloat32,
  kFloat64,
  kBFloat16,  // reduced in float32 and rounded once (to nearest even) at the end
  kFloat16,   // likewise
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,  // SUM and MAX are logical or, PRODUCT and MIN logical and
};

enum class ReduceOp : uint8_t { kSum, kAvg, kProduct, kMin, kMax };

size_t element_size(Datatype dtype);
const char* datatype_name(Datatype dtype);
const char* reduce_op_name(ReduceOp op);
bool is_floating(Datatype dtype);

struct CollectiveOptions {
  Datatype dtype = Datatype::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Tag tag;  // sequence number and kind, checked against the peers' (mismatch detection)
  Clock::time_point deadline = Clock::time_point::max();
  // A ring step moves at most this many bytes per chunk; tests lower it to cover many slabs.
  size_t max_segment_bytes = size_t{1} << 20;
  // all-reduces of at most this many bytes use the one-step direct exchange.
  size_t small_message_bytes = size_t{16} << 10;
  // Where the group spans hosts (Transport::host_of), all-reduce, reduce-scatter and all-gather
  // work within hosts and between the ranks of one local rank across them (*_hierarchical.cc);
  // false keeps the flat algorithms over every rank.
  bool hierarchical = true;
  // The hierarchical reduce-scatter regroups its input for one pass within each host when a block
  // is at most this large, else it runs one pass per host (reduce_scatter_hierarchical.cc).
  // Measured on 4 emulated hosts x 2 ranks at 1 Gbit/s (2 cores): one pass was faster with blocks
  // of 8 and 32 KiB, one per host from 128 KiB.
  size_t grouped_block_bytes = size_t{64} << 10;
  // Collectives whose output is at least this large write it with streaming stores
  // (common/stream_copy.h): it cannot stay in the cache anyway, and skipping the read for
  // ownership cuts the memory traffic of a copy by a third.
  size_t streaming_bytes = size_t{16} << 20;
};

}  // namespace shardwise::collectives
