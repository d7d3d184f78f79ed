// ShmTransport's set-up: rank 0 creates the segment (shm_segment.h), every rank maps it, checks
// that all agree on its layout, waits for the others to attach, and probes whether single-copy
// messages (process_vm_readv) work between every pair.
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
#include "collectives/shm_transport.h"
#include "collectives/transport_errors.h"
#include "collectives/wait_chain.h"
#include "common/spin_wait.h"

namespace shardwise::collectives {

using namespace shm;  // the segment's layout and helpers

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
      stores_(StoreChoice::for_host(
          options.stores,
          options.size,
          options.cores > 0 ? options.cores : ::sysconf(_SC_NPROCESSORS_ONLN))),
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

}  // namespace shardwise::collectives
