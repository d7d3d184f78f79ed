#include "collectives/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "collectives/shm_segment.h"
#include "collectives/transport_errors.h"
#include "collectives/wait_chain.h"
#include "common/spin_wait.h"
#include "common/stream_copy.h"

namespace shardwise::collectives {

using namespace shm;  // the segment's layout and helpers

namespace {
struct WaitCounters {
  std::atomic<uint64_t> waits{0};
  std::atomic<uint64_t> sleeps{0};
};
WaitCounters& wait_counters() {
  static WaitCounters counters;
  return counters;
}
}  // namespace

ShmTransport::WaitStats ShmTransport::wait_stats() {
  return {wait_counters().waits.load(), wait_counters().sleeps.load()};
}

void ShmTransport::ring_doorbell(int rank) {
  RankSlot& slot = layout_->slots[rank];
  slot.doorbell.fetch_add(1);
  if (slot.sleepers.load() != 0) {
    ::syscall(SYS_futex, &slot.doorbell, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  }
}

void ShmTransport::wait_until_rung(uint32_t seen, Clock::time_point deadline) {
  wait_counters().waits.fetch_add(1, std::memory_order_relaxed);
  RankSlot& slot = layout_->slots[rank_];
  const auto budget = std::chrono::duration_cast<std::chrono::microseconds>(
      std::min<Clock::duration>(spin_, std::max<Clock::duration>(deadline - Clock::now(), {})));
  if (spin_until([&] { return slot.doorbell.load(std::memory_order_acquire) != seen; }, budget)) {
    return;
  }
  const auto wait = std::min<Clock::duration>(kPollInterval, deadline - Clock::now());
  if (wait <= Clock::duration::zero()) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
  timespec timeout{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  slot.sleepers.fetch_add(1);
  wait_counters().sleeps.fetch_add(1, std::memory_order_relaxed);
  ::syscall(SYS_futex, &slot.doorbell, FUTEX_WAIT, seen, &timeout, nullptr, 0);
  slot.sleepers.fetch_sub(1);
}

void ShmTransport::check_peers(int peer_a, int peer_b, Tag tag, bool liveness) {
  SegmentHeader& header = *layout_->header;
  const int failed = header.failed_rank.load();
  if (failed >= 0) {
    throw TransportError(named(rank_) + ": group failed in " + tag_text(tag) + ": " +
                         failure_text(header));
  }
  if (!liveness) return;
  for (int peer : {peer_a, peer_b}) {
    if (peer >= 0 && !process_alive(layout_->slots[peer].pid.load())) {
      throw TransportError(named(rank_) + ": peer " + named(peer) + " (pid " +
                           std::to_string(layout_->slots[peer].pid.load()) + ") exited during " +
                           tag_text(tag));
    }
  }
}

// One direction of a sendrecv in progress. An inline message is a stream of 64 +
// round_up(bytes, 64) bytes: its header line, then the payload padded to whole lines. Counters
// only ever move by whole lines, so every piece is line-aligned. A single-copy message is its
// header line alone, naming where the payload lies in the sender's memory: the receiver reads it
// from there (process_vm_readv), then counts it in `copied`, and only then may the sender return.
class ShmTransport::Progress {
 public:
  Progress(Layout& layout, int source, int destination)
      : counters_(layout.counter(source, destination)),
        ring_(layout.ring(source, destination)),
        ring_bytes_(layout.ring_bytes) {}

  static size_t stream_bytes(Mode mode, size_t bytes) {
    return kLine + (mode == Mode::kInline ? round_up(bytes, kLine) : 0);
  }

  // Writes what fits of `header` + `payload` (the payload with streaming stores if asked);
  // returns whether anything moved.
  bool push(const MessageHeader& header, const char* payload, bool streaming) {
    const size_t bytes = header.bytes;
    if (done_ == 0) {
      total_ = stream_bytes(header.mode, bytes);
      copied_target_ = counters_.copied.load(std::memory_order_relaxed) + 1;
    }
    const uint64_t head = counters_.head.load(std::memory_order_relaxed);
    const uint64_t tail = counters_.tail.load(std::memory_order_acquire);
    const size_t amount = std::min<size_t>(ring_bytes_ - (head - tail), total_ - done_);
    if (amount == 0) return false;
    for (size_t moved = 0; moved < amount;) {  // line by line regions: header, payload, padding
      const size_t position = done_ + moved;
      const size_t offset = (head + moved) % ring_bytes_;
      const size_t room = std::min(amount - moved, ring_bytes_ - offset);
      size_t step;
      if (position < kLine) {
        step = std::min(room, kLine - position);
        std::memcpy(ring_ + offset, reinterpret_cast<const char*>(&header) + position, step);
      } else {
        const size_t at = position - kLine;
        step = std::min(room, (at < bytes ? bytes : round_up(bytes, kLine)) - at);
        if (at < bytes) {
          if (streaming) {
            shardwise::stream_copy(ring_ + offset, payload + at, step);
          } else {
            std::memcpy(ring_ + offset, payload + at, step);
          }
        }
      }
      moved += step;
    }
    done_ += amount;
    counters_.head.store(head + amount, std::memory_order_release);
    return true;
  }

  // The send is over once its stream is written and, for a single-copy message, read.
  bool sent(Mode mode) const {
    return done_ == total_ && (mode == Mode::kInline ||
                               counters_.copied.load(std::memory_order_acquire) >= copied_target_);
  }

  // Consumes what has arrived; returns whether anything moved. Checks the header first.
  bool pull(ShmTransport& transport,
            int peer,
            Tag tag,
            size_t bytes,
            const RecvConsumer& consume,
            char* into) {
    if (done_ == 0) total_ = stream_bytes(Mode::kInline, bytes);  // until the header says else
    const uint64_t tail = counters_.tail.load(std::memory_order_relaxed);
    const uint64_t head = counters_.head.load(std::memory_order_acquire);
    const size_t amount = std::min<size_t>(head - tail, total_ - done_);
    if (amount == 0) return false;
    for (size_t moved = 0; moved < amount;) {
      const size_t position = done_ + moved;
      const size_t offset = (tail + moved) % ring_bytes_;
      const size_t room = std::min(amount - moved, ring_bytes_ - offset);
      size_t step;
      if (position < kLine) {  // the header is one line and lines never wrap
        MessageHeader got;
        std::memcpy(&got, ring_ + offset, sizeof(got));
        check_header(transport.group_rank(transport.rank_), transport.group_rank(peer), tag, bytes,
                     Tag{got.sequence, got.kind}, got.bytes);
        if (got.mode == Mode::kSingleCopy) {
          transport.read_single_copy(peer, got.address, bytes, consume, into, tag);
          total_ = done_ = kLine;
          counters_.tail.store(tail + kLine, std::memory_order_release);
          counters_.copied.fetch_add(1, std::memory_order_acq_rel);
          return true;
        }
        step = kLine;
      } else {
        const size_t at = position - kLine;
        step = std::min(room, (at < bytes ? bytes : round_up(bytes, kLine)) - at);
        if (at < bytes) consume(at, ring_ + offset, step);
      }
      moved += step;
    }
    done_ += amount;
    counters_.tail.store(tail + amount, std::memory_order_release);
    return true;
  }

  bool received() const { return done_ == total_ && total_ != 0; }

 private:
  RingCounters& counters_;
  char* ring_;
  size_t ring_bytes_;
  size_t done_ = 0;
  size_t total_ = 0;
  uint64_t copied_target_ = 0;
};

bool ShmTransport::message_waiting(int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw std::invalid_argument("ShmTransport::message_waiting: peer " + std::to_string(peer) +
                                " is not another rank of this group of " + std::to_string(size_));
  }
  check_peers(peer, -1, Tag{}, false);  // a failed group (abort) is an error, not a wait
  RingCounters& ring = layout_->counter(peer, rank_);
  return ring.head.load(std::memory_order_acquire) != ring.tail.load(std::memory_order_relaxed);
}

void ShmTransport::read_single_copy(
    int peer, uint64_t address, size_t bytes, const RecvConsumer& consume, char* into, Tag tag) {
  const int32_t pid = layout_->slots[peer].pid.load();
  auto fail = [&] {
    throw TransportError(named(rank_) + ": reading " + std::to_string(bytes) + " bytes from " +
                         named(peer) + " (pid " + std::to_string(pid) + ") in " + tag_text(tag) +
                         " failed: " + std::strerror(errno));
  };
  if (into != nullptr) {
    if (!read_remote(pid, address, into, bytes)) fail();
    return;
  }
  thread_local std::vector<char> bounce(kBounceBytes);
  for (size_t done = 0; done < bytes; done += kBounceBytes) {
    const size_t n = std::min(kBounceBytes, bytes - done);
    if (!read_remote(pid, address + done, bounce.data(), n)) fail();
    consume(done, bounce.data(), n);
  }
}

void ShmTransport::sendrecv(int send_peer,
                            ConstBuffer send,
                            int recv_peer,
                            size_t recv_bytes,
                            const RecvConsumer& consume,
                            Tag tag,
                            Clock::time_point deadline) {
  exchange(send_peer, send, recv_peer, recv_bytes, consume, nullptr, tag, deadline);
}

void ShmTransport::sendrecv(int send_peer,
                            ConstBuffer send,
                            int recv_peer,
                            Buffer recv,
                            Tag tag,
                            Clock::time_point deadline) {
  exchange(send_peer, send, recv_peer, recv.bytes, copy_into(recv.data),
           static_cast<char*>(recv.data), tag, deadline);
}

void ShmTransport::exchange(int send_peer,
                            ConstBuffer send,
                            int recv_peer,
                            size_t recv_bytes,
                            const RecvConsumer& consume,
                            char* recv_into,
                            Tag tag,
                            Clock::time_point deadline) {
  for (int peer : {send_peer, recv_peer}) {
    if (peer == rank_ || peer >= size_) {
      throw std::invalid_argument("ShmTransport::sendrecv: peer " + std::to_string(peer) +
                                  " is not another rank of this group of " + std::to_string(size_));
    }
  }
  const Mode mode = single_copy_ && send.bytes > 0 && send.bytes >= single_copy_bytes_
                        ? Mode::kSingleCopy
                        : Mode::kInline;
  const MessageHeader header{tag.sequence, send.bytes, tag.kind, mode,
                             reinterpret_cast<uint64_t>(send.data)};
  const bool streaming = mode == Mode::kInline && stores_.stream(send.bytes);
  // Only the messages the store choice measures pay for reading the clock.
  const bool timed = mode == Mode::kInline && send.bytes >= StoreChoice::kMinBytes;
  const Clock::time_point started = timed ? Clock::now() : Clock::time_point{};
  Progress out = send_peer >= 0 ? Progress(*layout_, rank_, send_peer) : Progress(*layout_, 0, 0);
  Progress in = recv_peer >= 0 ? Progress(*layout_, recv_peer, rank_) : Progress(*layout_, 0, 0);
  bool sending = send_peer >= 0;
  bool receiving = recv_peer >= 0;
  const char* payload = static_cast<const char*>(send.data);
  // The failure flag is read at every wait; whether the peers' processes still exist (a system
  // call and a /proc read) once per kPollInterval of waiting.
  Clock::time_point next_liveness_check = Clock::now() + kPollInterval;
  while (sending || receiving) {
    const uint32_t seen = layout_->slots[rank_].doorbell.load();
    bool moved = false;
    if (sending && out.push(header, payload, streaming)) {
      moved = true;
      ring_doorbell(send_peer);
    }
    if (sending && out.sent(mode)) {
      sending = false;
      moved = true;
    }
    if (receiving && in.pull(*this, recv_peer, tag, recv_bytes, consume, recv_into)) {
      moved = true;
      ring_doorbell(recv_peer);
      receiving = !in.received();
    }
    if (moved || (!sending && !receiving)) continue;
    const Clock::time_point now = Clock::now();
    const bool liveness = now >= next_liveness_check;
    if (liveness) next_liveness_check = now + kPollInterval;
    check_peers(sending ? send_peer : -1, receiving ? recv_peer : -1, tag, liveness);
    if (now >= deadline) {
      fail_timed_out(receiving ? recv_peer : send_peer, receiving ? recv_bytes : send.bytes, tag,
                     receiving);
    }
    wait_until_rung(seen, deadline);
  }
  if (timed) stores_.record(send.bytes, Clock::now() - started);
}

int ShmTransport::group_rank(int rank) const {
  const bool renamed = rank >= 0 && rank < static_cast<int>(group_ranks_.size());
  return renamed ? group_ranks_[rank] : rank;
}

std::string ShmTransport::named(int rank) const {
  return "rank " + std::to_string(group_rank(rank));
}

// This rank's deadline passed while it waited for `peer`. It publishes whom it waited for, then
// waits up to abort_grace_ for the group's failure notice: a rank further along the chain of waits
// that is blocked beyond this segment (across the network) fails at about the same moment, and its
// notice names the rank truly at fault. Without a notice, the error follows the chain of ranks
// that timed out here (wait_chain.h).
void ShmTransport::fail_timed_out(int peer, size_t bytes, Tag tag, bool receiving) {
  RankSlot& mine = layout_->slots[rank_];
  mine.timed_out_waiting_for.store(peer + 1);  // 0 in a new segment means "not timed out"
  const std::string own = timeout_message(group_rank(rank_), group_rank(peer), bytes, tag) +
                          (receiving ? "" : " (it has not taken the message)");
  SegmentHeader& header = *layout_->header;
  const Clock::time_point until = Clock::now() + abort_grace_;
  for (;;) {
    const uint32_t seen = mine.doorbell.load();
    if (header.failed_rank.load() >= 0 || Clock::now() >= until) break;
    wait_until_rung(seen, until);
  }
  if (header.failed_rank.load() >= 0) {
    throw TransportError(own + "; meanwhile the group failed: " + failure_text(header));
  }
  const auto waiting_for = [this](int r) {
    return layout_->slots[r].timed_out_waiting_for.load() - 1;
  };
  throw TransportError(own + describe_wait_chain(rank_, peer, size_, waiting_for,
                                                 [this](int r) { return named(r); }));
}

// The first rank to abort claims `failure_claimed`, writes `failure`, and only then publishes
// `failed_rank`: a peer that sees failed_rank >= 0 always reads the whole text.
void ShmTransport::abort(const std::string& reason) {
  SegmentHeader& header = *layout_->header;
  int expected = -1;
  if (header.failure_claimed.compare_exchange_strong(expected, rank_)) {
    const std::string text = named(rank_) + " aborted: " + reason;
    std::strncpy(header.failure, text.c_str(), sizeof(header.failure) - 1);
    header.failed_rank.store(rank_);
  }
  for (int r = 0; r < size_; ++r) ring_doorbell(r);
}

}  // namespace shardwise::collectives
