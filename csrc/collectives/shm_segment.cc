// The helpers of the shared-memory segment (shm_segment.h): the single-copy probe tokens, remote
// reads, peer liveness, and waiting for rank 0's initialisation.
#include "collectives/shm_segment.h"

#include <signal.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "collectives/transport_errors.h"

namespace shardwise::collectives::shm {

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

}  // namespace shardwise::collectives::shm
