// A Transport between processes on one host, through one POSIX shared-memory segment.
//
// Layout: a header, one slot per rank (pid, doorbell, sleeper count), and one single-producer /
// single-consumer byte ring per ordered pair of ranks (source -> destination), each
// `ring_bytes` long with `head` (bytes written) and `tail` (bytes read) counters. A message is a
// 64-byte header (tag, length) followed by its payload, padded to 64 bytes; partial writes are
// multiples of 64 bytes, so a piece handed to a RecvConsumer never splits an element.
//
// Large messages are written with ordinary or streaming stores, whichever this rank has measured
// to be faster (store_choice.h: it depends on whether the ranks' cores share a cache), or with
// ordinary stores where the host's ranks outnumber its cores.
//
// sendrecv interleaves both halves in one progress loop: write what fits into the ring to the
// send peer, consume what has arrived from the receive peer, repeat. A rank with nothing to do
// polls its own doorbell for up to `spin` (writers ring it after publishing data, readers after
// freeing space; see common/spin_wait.h), then sleeps on it (a futex). Polling is what makes
// small messages fast (a futex wake-up costs more than moving 64 KiB); sleeping is what lets more
// ranks than cores share the machine, so the default spin is zero when this host's ranks
// outnumber its cores. While waiting it checks the deadline and the group's failure flag, and
// every few milliseconds whether its peers' processes still exist.
//
// Lifetime: rank 0 creates the segment (mode 0600, O_EXCL) under a caller-chosen unique name; the
// others attach; once all have attached, rank 0 unlinks the name, so the memory disappears with
// the last process, even one killed by a signal. Nothing is left in /dev/shm after set-up.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/store_choice.h"
#include "collectives/transport.h"

namespace shardwise::collectives {

struct ShmTransportOptions {
  std::string name;  // POSIX shm name ("/shardwise-<unique>"), the same on every rank
  int rank = 0;
  int size = 1;
  size_t ring_bytes = size_t{1} << 20;  // per ordered pair of ranks; a multiple of 4096
  std::chrono::milliseconds connect_timeout = std::chrono::minutes(5);
  // How long a waiting rank polls before it sleeps; shardwise::default_spin(size) when negative.
  std::chrono::microseconds spin{-1};
  // Messages of at least this many bytes go by a single copy: the receiver reads them straight
  // from the sender's memory (process_vm_readv) instead of both copying through the ring. Used
  // only where every rank can read every peer's memory (probed at set-up); 0 turns it off, the
  // default: on the KVM guests measured here process_vm_readv moved 4-10 GB/s against memcpy's
  // 11-90 GB/s, so two copies through the ring were faster at every size.
  size_t single_copy_bytes = 0;
  // The rank each member has in the enclosing group (a hybrid transport's local ranks are its
  // host's ranks, renumbered from 0): errors name ranks by it. Empty: the ranks are the group's.
  std::vector<int> group_ranks;
  // Once a wait's deadline passes, how long the rank waits for a failure notice from the group
  // (abort) before raising its own timeout. A rank further along the chain of waits, blocked on a
  // peer this rank cannot see (across the network), times out at about the same moment; its notice
  // names the rank truly at fault.
  std::chrono::milliseconds abort_grace{2000};
  // How large messages are written into the rings: measured per size class (store_choice.h), or
  // always ordinary (cached) or streaming (non-temporal) stores.
  StoreChoice::Kind stores = StoreChoice::Kind::kMeasured;
  // This host's online CPUs, which StoreChoice::for_host weighs the ranks against; 0: asked of
  // the system (sysconf).
  long cores = 0;
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
  // With a destination buffer: single-copy messages are read straight into it.
  void sendrecv(int send_peer,
                ConstBuffer send,
                int recv_peer,
                Buffer recv,
                Tag tag,
                Clock::time_point deadline) override;
  void abort(const std::string& reason) override;
  bool message_waiting(int peer) override;

  // Whether messages of single_copy_bytes or more go by a single copy in this group.
  bool single_copy() const { return single_copy_; }
  // How large messages are written: options.stores, except that a measured choice becomes
  // ordinary stores where this host's ranks outnumber its cores (StoreChoice::for_host).
  StoreChoice::Kind stores() const { return stores_.kind(); }

  // Bytes of shared memory a group of `size` ranks with `ring_bytes` rings maps.
  static size_t segment_bytes(int size, size_t ring_bytes);

  // How this process's exchanges have waited since it started, over every ShmTransport: `waits`
  // found nothing to move, `sleeps` of them ended asleep on the doorbell (a futex).
  struct WaitStats {
    uint64_t waits = 0;
    uint64_t sleeps = 0;
  };
  static WaitStats wait_stats();

 private:
  struct Layout;
  class Progress;
  void attach(const ShmTransportOptions& options);
  int open_segment_of_rank0(Clock::time_point deadline);
  [[noreturn]] void reject_other_layout(int fd, Clock::time_point deadline);
  std::string layout_mismatch(int created_size, uint64_t created_ring_bytes) const;
  void wait_for_attach(Clock::time_point deadline);
  void probe_single_copy(Clock::time_point deadline);
  void exchange(int send_peer,
                ConstBuffer send,
                int recv_peer,
                size_t recv_bytes,
                const RecvConsumer& consume,
                char* recv_into,
                Tag tag,
                Clock::time_point deadline);
  void read_single_copy(
      int peer, uint64_t address, size_t bytes, const RecvConsumer& consume, char* into, Tag tag);
  void ring_doorbell(int rank);
  void wait_until_rung(uint32_t seen, Clock::time_point deadline);
  void check_peers(int peer_a, int peer_b, Tag tag, bool liveness);
  [[noreturn]] void fail_timed_out(int peer, size_t bytes, Tag tag, bool receiving);
  int group_rank(int rank) const;
  std::string named(int rank) const;

  int rank_;
  int size_;
  size_t ring_bytes_;
  std::chrono::microseconds spin_;
  size_t single_copy_bytes_;
  std::vector<int> group_ranks_;
  std::chrono::milliseconds abort_grace_;
  bool single_copy_ = false;
  StoreChoice stores_;  // ordinary or streaming stores for large messages (store_choice.h)
  alignas(64) uint64_t probe_[8];  // read by every peer at set-up (probe_single_copy)
  std::string name_;
  size_t mapped_bytes_ = 0;
  char* base_ = nullptr;
  Layout* layout_ = nullptr;
};

}  // namespace shardwise::collectives
