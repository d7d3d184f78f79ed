// The shared-memory segment of ShmTransport (shm_transport.h), as every rank maps it: a header
// page (SegmentHeader), one line per rank (RankSlot: pid, doorbell, single-copy verdict), the
// ring counters of every (source, destination) pair, then the rings themselves, each ring_bytes.
// Messages in a ring are a MessageHeader line and, inline, the payload padded to whole lines.
// Internal to the transport: shm_transport_setup.cc creates and attaches the segment, and
// shm_transport.cc moves messages through it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/shm_transport.h"

namespace shardwise::collectives::shm {

constexpr uint64_t kReady = 0x73686172'64776973ull;  // "shardwis"
constexpr size_t kLine = 64;
constexpr size_t kPage = 4096;
constexpr auto kPollInterval = std::chrono::milliseconds(5);

inline size_t round_up(size_t value, size_t unit) { return (value + unit - 1) / unit * unit; }

struct alignas(kLine) SegmentHeader {
  std::atomic<uint64_t> ready;
  int32_t size;
  uint64_t ring_bytes;
  std::atomic<int32_t> attached;
  std::atomic<int32_t> failure_claimed;  // the first rank to abort sets it, then writes `failure`
  std::atomic<int32_t> failed_rank;      // published only once `failure` is written
  char failure[256];
};

struct alignas(kLine) RankSlot {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> sleepers;
  std::atomic<int32_t> single_copy;            // 0 not probed yet, 1 reads every peer, 2 cannot
  std::atomic<uint64_t> probe_address;         // where this rank's probe token lives
  std::atomic<int32_t> timed_out_waiting_for;  // set by fail_timed_out; 0 in a new segment
};

struct alignas(kLine) RingCounters {
  std::atomic<uint64_t> head;  // bytes written by the source
  char pad_head[kLine - sizeof(std::atomic<uint64_t>)];
  std::atomic<uint64_t> tail;    // bytes read by the destination
  std::atomic<uint64_t> copied;  // single-copy messages the destination has finished reading
  char pad_tail[kLine - 2 * sizeof(std::atomic<uint64_t>)];
};

enum class Mode : uint32_t { kInline = 0, kSingleCopy = 1 };

struct alignas(kLine) MessageHeader {
  uint64_t sequence;
  uint64_t bytes;
  uint32_t kind;
  Mode mode;
  uint64_t address;  // kSingleCopy: where the payload lies in the sender's memory
};

constexpr size_t kBounceBytes = size_t{64} << 10;  // single-copy reads for a RecvConsumer

// The words a rank publishes for its peers' single-copy probe (process_vm_readv).
uint64_t probe_token(int rank, int word);

// Reads `bytes` at `address` of process `pid` into `into` (process_vm_readv); false on failure.
bool read_remote(int32_t pid, uint64_t address, void* into, size_t bytes);

// "what(name) failed: strerror(errno)".
std::string errno_text(const char* what, const std::string& name);

// False when `pid` has exited (or is a zombie); true while unknown (not attached yet).
bool process_alive(int32_t pid);

// Waits until rank 0 has filled in `header`; `segment` names the segment and the waiting rank.
void wait_until_initialised(const SegmentHeader& header,
                            Clock::time_point deadline,
                            const std::string& segment);

// The reason the first aborting rank wrote; read only once failed_rank >= 0.
std::string failure_text(const SegmentHeader& header);

}  // namespace shardwise::collectives::shm

namespace shardwise::collectives {

// Where each part of the mapped segment starts.
struct ShmTransport::Layout {
  shm::SegmentHeader* header;
  shm::RankSlot* slots;
  shm::RingCounters* counters;
  char* rings;
  size_t ring_bytes;
  int size;
  shm::RingCounters& counter(int source, int destination) {
    return counters[source * size + destination];
  }
  char* ring(int source, int destination) {
    return rings + static_cast<size_t>(source * size + destination) * ring_bytes;
  }
};

}  // namespace shardwise::collectives
