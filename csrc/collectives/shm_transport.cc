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

#include "collectives/transport_errors.h"
#include "collectives/wait_chain.h"
#include "common/spin_wait.h"

namespace shardwise::collectives {
namespace {

constexpr uint64_t kReady = 0x73686172'64776973ull;  // "shardwis"
constexpr size_t kLine = 64;
constexpr size_t kPage = 4096;
constexpr auto kPollInterval = std::chrono::milliseconds(5);

size_t round_up(size_t value, size_t unit) { return (value + unit - 1) / unit * unit; }

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

uint64_t probe_token(int rank, int word) {
  return kReady ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(rank + 1)) ^
         static_cast<uint64_t>(word);
}

// Reads `bytes` at `address` of process `pid` into `into` (process_vm_readv); false on failure.
bool read_remote(int32_t pid, uint64_t address, void* into, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(into) + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + done), bytes - done};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

std::string errno_text(const char* what, const std::string& name) {
  return std::string(what) + "(" + name + ") failed: " + std::strerror(errno);
}

bool process_alive(int32_t pid) {
  if (pid <= 0) return true;  // not attached yet: the connect timeout covers it
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  if (stat >> pid_field >> comm >> state) {  // a zombie has exited but is not yet reaped
    return state != "Z";
  }
  return true;
}

// Waits until rank 0 has filled in `header`; `segment` names the segment and the waiting rank.
void wait_until_initialised(const SegmentHeader& header,
                            Clock::time_point deadline,
                            const std::string& segment) {
  while (header.ready.load(std::memory_order_acquire) != kReady) {
    if (Clock::now() > deadline) throw TransportError(segment + " was never initialised by rank 0");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The reason the first aborting rank wrote; read only once failed_rank >= 0.
std::string failure_text(const SegmentHeader& header) {
  return std::string(header.failure, strnlen(header.failure, sizeof(header.failure)));
}

}  // namespace

struct ShmTransport::Layout {
  SegmentHeader* header;
  RankSlot* slots;
  RingCounters* counters;
  char* rings;
  size_t ring_bytes;
  int size;
  RingCounters& counter(int source, int destination) {
    return counters[source * size + destination];
  }
  char* ring(int source, int destination) {
    return rings + static_cast<size_t>(source * size + destination) * ring_bytes;
  }
};

size_t ShmTransport::segment_bytes(int size, size_t ring_bytes) {
  const size_t slots = round_up(sizeof(RankSlot) * size, kPage);
  const size_t counters = round_up(sizeof(RingCounters) * size * size, kPage);
  return kPage + slots + counters + ring_bytes * size * size;
}

ShmTransport::ShmTransport(const ShmTransportOptions& options)
    : rank_(options.rank),
      size_(options.size),
      ring_bytes_(options.ring_bytes),
      spin_(options.spin.count() < 0 ? shardwise::default_spin(options.size) : options.spin),
      single_copy_bytes_(options.single_copy_bytes),
      group_ranks_(options.group_ranks),
      abort_grace_(options.abort_grace),
      name_(options.name) {
  for (int word = 0; word < 8; ++word) probe_[word] = probe_token(rank_, word);
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    throw std::invalid_argument("ShmTransport: rank " + std::to_string(rank_) + " is outside [0, " +
                                std::to_string(size_) + ")");
  }
  if (!group_ranks_.empty() && static_cast<int>(group_ranks_.size()) != size_) {
    throw std::invalid_argument("ShmTransport: group_ranks names " +
                                std::to_string(group_ranks_.size()) + " ranks for a group of " +
                                std::to_string(size_) + "; give one per rank, or none");
  }
  if (ring_bytes_ < kPage || ring_bytes_ % kPage != 0) {
    throw std::invalid_argument(
        "ShmTransport: ring_bytes must be a positive multiple of 4096, got " +
        std::to_string(ring_bytes_));
  }
  const Clock::time_point deadline = Clock::now() + options.connect_timeout;
  try {
    attach(options);
    wait_for_attach(deadline);
    probe_single_copy(deadline);
  } catch (...) {
    if (rank_ == 0) ::shm_unlink(name_.c_str());
    if (base_ != nullptr) ::munmap(base_, mapped_bytes_);
    delete layout_;
    throw;
  }
  if (rank_ == 0) ::shm_unlink(name_.c_str());  // every rank has mapped it: drop the name
}

ShmTransport::~ShmTransport() {
  if (base_ != nullptr) ::munmap(base_, mapped_bytes_);
  delete layout_;
}

std::string ShmTransport::layout_mismatch(int created_size, uint64_t created_ring_bytes) const {
  return named(rank_) + " joined with world size " + std::to_string(size_) + " and ring_bytes " +
         std::to_string(ring_bytes_) + ", but rank 0 created the group with " +
         std::to_string(created_size) + " and " + std::to_string(created_ring_bytes) +
         "; start every rank alike";
}

// Rank 0 creates the segment empty, then gives it its final size in one ftruncate. A peer waits
// for a non-zero size: the size of this rank's layout means the segment is ready to map; any other
// means rank 0 was started with another world size or ring_bytes, and the peer fails now, naming
// both, instead of waiting out the connect timeout.
int ShmTransport::open_segment_of_rank0(Clock::time_point deadline) {
  for (;;) {
    const int fd = ::shm_open(name_.c_str(), O_RDWR, 0600);
    struct stat info{};
    if (fd >= 0 && ::fstat(fd, &info) == 0 && info.st_size > 0) {
      if (static_cast<size_t>(info.st_size) == mapped_bytes_) return fd;
      if (static_cast<size_t>(info.st_size) >= sizeof(SegmentHeader)) {
        reject_other_layout(fd, deadline);
      }
    }
    if (fd >= 0) ::close(fd);
    if (Clock::now() > deadline) {
      throw TransportError(named(rank_) + ": shared-memory segment " + name_ +
                           " of rank 0 did not appear (with the expected size " +
                           std::to_string(mapped_bytes_) + ") before the connect timeout");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Reads the header of a segment whose size is not this rank's layout, closes `fd`, and throws.
void ShmTransport::reject_other_layout(int fd, Clock::time_point deadline) {
  void* mapped = ::mmap(nullptr, sizeof(SegmentHeader), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) throw TransportError(errno_text("mmap", name_));
  const auto* header = static_cast<const SegmentHeader*>(mapped);
  std::string text;
  try {
    wait_until_initialised(*header, deadline, named(rank_) + ": shared-memory segment " + name_);
    text = layout_mismatch(header->size, header->ring_bytes);
  } catch (...) {
    ::munmap(mapped, sizeof(SegmentHeader));
    throw;
  }
  ::munmap(mapped, sizeof(SegmentHeader));
  throw TransportError(text);
}

void ShmTransport::attach(const ShmTransportOptions& options) {
  mapped_bytes_ = segment_bytes(size_, ring_bytes_);
  const Clock::time_point deadline = Clock::now() + options.connect_timeout;
  int fd = -1;
  if (rank_ == 0) {
    fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw TransportError(errno_text("shm_open", name_));
    if (::ftruncate(fd, static_cast<off_t>(mapped_bytes_)) != 0) {
      ::close(fd);
      throw TransportError(errno_text("ftruncate", name_) + " (is /dev/shm large enough for " +
                           std::to_string(mapped_bytes_) + " bytes?)");
    }
  } else {
    fd = open_segment_of_rank0(deadline);
  }
  void* mapped = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) throw TransportError(errno_text("mmap", name_));
  base_ = static_cast<char*>(mapped);
  const size_t slots_offset = kPage;
  const size_t counters_offset = slots_offset + round_up(sizeof(RankSlot) * size_, kPage);
  const size_t rings_offset =
      counters_offset + round_up(sizeof(RingCounters) * size_ * size_, kPage);
  layout_ = new Layout{reinterpret_cast<SegmentHeader*>(base_),
                       reinterpret_cast<RankSlot*>(base_ + slots_offset),
                       reinterpret_cast<RingCounters*>(base_ + counters_offset),
                       base_ + rings_offset,
                       ring_bytes_,
                       size_};
  SegmentHeader& header = *layout_->header;
  if (rank_ == 0) {  // the file is zero-filled: only the non-zero fields need setting
    header.size = size_;
    header.ring_bytes = ring_bytes_;
    header.failure_claimed.store(-1);
    header.failed_rank.store(-1);
    header.ready.store(kReady, std::memory_order_release);
  } else {
    wait_until_initialised(header, deadline, named(rank_) + ": shared-memory segment " + name_);
    if (header.size != size_ || header.ring_bytes != ring_bytes_) {
      throw TransportError(layout_mismatch(header.size, header.ring_bytes));
    }
  }
  layout_->slots[rank_].pid.store(static_cast<int32_t>(::getpid()));
  layout_->slots[rank_].probe_address.store(reinterpret_cast<uint64_t>(probe_));
  header.attached.fetch_add(1);
}

void ShmTransport::wait_for_attach(Clock::time_point deadline) {
  while (layout_->header->attached.load() < size_) {
    if (Clock::now() > deadline) {
      std::string missing;
      for (int r = 0; r < size_; ++r) {
        if (layout_->slots[r].pid.load() == 0) missing += (missing.empty() ? " " : ", ") + named(r);
      }
      throw TransportError(
          named(rank_) +
          ": ranks never attached to shared memory before the connect timeout:" + missing);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Whether every rank can read every peer's memory (process_vm_readv: same user, and no seccomp
// filter or Yama ptrace scope forbidding it): each rank reads every peer's probe token and
// publishes the verdict; single-copy messages are used only if all ranks succeeded.
void ShmTransport::probe_single_copy(Clock::time_point deadline) {
  bool readable = single_copy_bytes_ > 0;
  for (int peer = 0; readable && peer < size_; ++peer) {
    if (peer == rank_) continue;
    uint64_t got[8] = {};
    readable = read_remote(layout_->slots[peer].pid.load(),
                           layout_->slots[peer].probe_address.load(), got, sizeof(got));
    for (int word = 0; readable && word < 8; ++word) {
      readable = got[word] == probe_token(peer, word);
    }
  }
  layout_->slots[rank_].single_copy.store(readable ? 1 : 2);
  bool all = true;
  for (int peer = 0; peer < size_; ++peer) {
    int32_t verdict;
    while ((verdict = layout_->slots[peer].single_copy.load()) == 0) {
      if (Clock::now() > deadline) {
        throw TransportError(named(rank_) + ": " + named(peer) +
                             " never finished set-up before the connect timeout");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    all = all && verdict == 1;
  }
  single_copy_ = all;
}

void ShmTransport::ring_doorbell(int rank) {
  RankSlot& slot = layout_->slots[rank];
  slot.doorbell.fetch_add(1);
  if (slot.sleepers.load() != 0) {
    ::syscall(SYS_futex, &slot.doorbell, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  }
}

void ShmTransport::wait_until_rung(uint32_t seen, Clock::time_point deadline) {
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

  // Writes what fits of `header` + `payload`; returns whether anything moved.
  bool push(const MessageHeader& header, const char* payload) {
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
        if (at < bytes) std::memcpy(ring_ + offset, payload + at, step);
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
    if (sending && out.push(header, payload)) {
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
