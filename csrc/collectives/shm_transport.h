// A Transport between processes on one host, through one POSIX shared-memory segment.
//
// Layout: a header, one slot per rank (pid, doorbell, sleeper count), and one single-producer /
// single-consumer byte ring per ordered pair of ranks (source -> destination), each
// `ring_bytes` long with `head` (bytes written) and `tail` (bytes read) counters. A message is a
// 64-byte header (tag, length) followed by its payload, padded to 64 bytes; partial writes are
// multiples of 64 bytes, so a piece handed to a RecvConsumer never splits an element.
//
// sendrecv interleaves both halves in one progress loop: write what fits into the ring to the
// send peer, consume what has arrived from the receive peer, repeat. A rank with nothing to do
// spins briefly, then sleeps on its own doorbell (a futex), which writers ring after publishing
// data and readers ring after freeing space: waiting sleeps instead of spinning, so more ranks
// than cores do not starve each other. While asleep it wakes every few milliseconds to check the
// deadline, the group's failure flag and whether its peers' processes still exist.
//
// Lifetime: rank 0 creates the segment (mode 0600, O_EXCL) under a caller-chosen unique name; the
// others attach; once all have attached, rank 0 unlinks the name, so the memory disappears with
// the last process, even one killed by a signal. Nothing is left in /dev/shm after set-up.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/transport.h"

namespace shardwise::collectives {

struct ShmTransportOptions {
  std::string name;  // POSIX shm name ("/shardwise-<unique>"), the same on every rank
  int rank = 0;
  int size = 1;
  size_t ring_bytes = size_t{1} << 20;  // per ordered pair of ranks; a multiple of 4096
  std::chrono::milliseconds connect_timeout = std::chrono::minutes(5);
};

class ShmTransport : public Transport {
 public:
  // Creates (rank 0) or attaches to the segment and returns once every rank has attached.
  explicit ShmTransport(const ShmTransportOptions& options);
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  using Transport::sendrecv;
  void sendrecv(int send_peer,
                ConstBuffer send,
                int recv_peer,
                size_t recv_bytes,
                const RecvConsumer& consume,
                Tag tag,
                Clock::time_point deadline) override;
  void abort(const std::string& reason) override;

  // Bytes of shared memory a group of `size` ranks with `ring_bytes` rings maps.
  static size_t segment_bytes(int size, size_t ring_bytes);

 private:
  struct Layout;
  class Progress;
  void attach(const ShmTransportOptions& options);
  void wait_for_attach(Clock::time_point deadline);
  void ring_doorbell(int rank);
  void sleep_until_rung(uint32_t seen, Clock::time_point deadline, int peer_a, int peer_b);
  void check_peers(int peer_a, int peer_b, Tag tag);

  int rank_;
  int size_;
  size_t ring_bytes_;
  std::string name_;
  size_t mapped_bytes_ = 0;
  char* base_ = nullptr;
  Layout* layout_ = nullptr;
};

}  // namespace shardwise::collectives
