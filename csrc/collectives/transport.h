// The point-to-point interface every collective algorithm is written against, torch-free.
//
// A Transport connects the `size()` ranks of one group. Collectives only ever call `sendrecv`:
// send a buffer to one peer while receiving one from another. Implementations must make the two
// halves progress concurrently (a ring step sends right and receives left on every rank at once;
// blocking sends would deadlock once buffers fill) and must give up at `deadline`, throwing
// TransportError naming this rank, the peer and what was waited for, instead of hanging.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardwise::collectives {

using Clock = std::chrono::steady_clock;

// A peer failed, closed, or did not answer before the deadline.
class TransportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
};

struct ConstBuffer {
  const void* data = nullptr;
  size_t bytes = 0;
};

// What a message belongs to (the collective's sequence number and kind, chosen by the caller).
// Both ends pass the tag they expect; a receiver that gets another tag or another length throws
// TransportError, which turns mismatched collectives into an error instead of a hang or garbage.
struct Tag {
  uint64_t sequence = 0;
  uint32_t kind = 0;  // a Kind
};

// What kind of operation a message belongs to; named in error messages.
enum class Kind : uint32_t {
  kUnknown = 0,
  kAllreduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kAlltoall,
  kBarrier,
  kSendRecv,
  kReduce,
  kGather,
  kScatter,
};

inline const char* kind_name(uint32_t kind) {
  static const char* names[] = {"unknown",   "all_reduce", "all_gather", "reduce_scatter",
                                "broadcast", "all_to_all", "barrier",    "send/recv",
                                "reduce",    "gather",     "scatter"};
  return kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

inline Tag make_tag(Kind kind, uint64_t sequence) {
  return {sequence, static_cast<uint32_t>(kind)};
}

// Receives a message piece by piece straight out of the transport's memory: (offset of the piece
// within the message, its bytes). Pieces arrive in order, and a piece never splits an element of
// up to 64 bytes, so a collective can reduce from them without a staging copy.
using RecvConsumer = std::function<void(size_t offset, const void* data, size_t bytes)>;

// The consumer that copies each piece to `destination` + its offset.
RecvConsumer copy_into(void* destination);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sends `send` to rank `send_peer` and receives one message of exactly `recv_bytes` from rank
  // `recv_peer`, handing it to `consume` (messages between a pair of ranks arrive in the order
  // they were sent). A peer of -1 skips that half. Both messages carry `tag`. Throws
  // TransportError at `deadline`, when a peer has exited or failed, or on a tag/length mismatch.
  virtual void sendrecv(int send_peer,
                        ConstBuffer send,
                        int recv_peer,
                        size_t recv_bytes,
                        const RecvConsumer& consume,
                        Tag tag,
                        Clock::time_point deadline) = 0;

  // Marks the group failed (on every rank that shares it, where the transport can), so peers
  // blocked on this rank fail fast instead of waiting for their deadline.
  virtual void abort(const std::string& reason) = 0;

  // Whether the next message from `peer` has begun to arrive (nothing is consumed; a peer that
  // has closed its end after its last message has none, so one rank leaving does not fail a
  // receive from the others). What a receive from any source (recv_any.cc) polls. The default,
  // for transports that cannot tell, throws std::logic_error.
  virtual bool message_waiting(int peer);

  // The host of every rank (host_of()[r], numbered from 0) where ranks sit on several hosts
  // and the links between them differ; empty (the default) where every link is alike.
  virtual std::vector<int> host_of() const;

  // Receives into a buffer. The default hands `consume` a copy into it; a transport that can
  // place a message there directly (a single copy) overrides this.
  virtual void sendrecv(int send_peer,
                        ConstBuffer send,
                        int recv_peer,
                        Buffer recv,
                        Tag tag,
                        Clock::time_point deadline);
};

}  // namespace shardwise::collectives
