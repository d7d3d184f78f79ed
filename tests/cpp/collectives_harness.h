// Threads as ranks: runs one function per rank on its own thread, each with its own transport
// (in-process queues, a real shared-memory segment, TCP on loopback, or the hybrid of the two),
// and collects every rank's exception.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/hybrid_transport.h"
#include "collectives/inprocess_transport.h"
#include "collectives/shm_transport.h"
#include "collectives/tcp_transport.h"

namespace shardwise::collectives::testing {

// kShm copies every message through its ring; kShmSingleCopy reads messages of 64 bytes or more
// straight from the sender's memory. kHybrid splits the ranks between two pretend hosts (the lower
// half and the upper half): shared memory (single copy) inside each, TCP between them, as a group
// spanning two machines runs. kHybridPairs puts ranks 2h and 2h + 1 on pretend host h (at world 8,
// four hosts of two), so all-reduces take the hierarchical path wherever the world is even.
// kHybridStrided makes the same hosts of two from ranks h and h + world / 2: no host's ranks are
// consecutive.
enum class TransportKind {
  kInProcess,
  kShm,
  kShmSingleCopy,
  kTcp,
  kHybrid,
  kHybridPairs,
  kHybridStrided
};

constexpr size_t kTestSingleCopyBytes = 64;

inline const char* kind_label(TransportKind kind) {
  switch (kind) {
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kShmSingleCopy:
      return "shm1copy";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kHybrid:
      return "hybrid";
    case TransportKind::kHybridPairs:
      return "hybridpairs";
    case TransportKind::kHybridStrided:
      return "hybridstrided";
    default:
      return "inproc";
  }
}

// An in-memory rendezvous for threads (the backend uses the c10d Store).
struct MemoryRendezvous {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::string> values;
  Rendezvous view() {
    return {[this](const std::string& k, const std::string& v) {
              std::lock_guard<std::mutex> lock(mutex);
              values[k] = v;
              changed.notify_all();
            },
            [this](const std::string& k) {
              std::unique_lock<std::mutex> lock(mutex);
              changed.wait(lock, [&] { return values.count(k) > 0; });
              return values[k];
            }};
  }
};

inline std::string unique_shm_name() {
  static std::atomic<int> counter{0};
  return "/shardwise-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

inline std::unique_ptr<Transport> make_tcp(int rank, int world, MemoryRendezvous& rendezvous) {
  TcpTransportOptions options;
  options.rank = rank;
  options.size = world;
  options.connect_timeout = std::chrono::seconds(20);
  return std::make_unique<TcpTransport>(options, rendezvous.view());
}

inline std::unique_ptr<Transport> make_shm(const std::string& name,
                                           int rank,
                                           int world,
                                           size_t ring_bytes,
                                           size_t single_copy_bytes,
                                           std::vector<int> group_ranks = {}) {
  ShmTransportOptions options;
  options.group_ranks = std::move(group_ranks);
  options.abort_grace = std::chrono::milliseconds(200);
  options.name = name;
  options.rank = rank;
  options.size = world;
  options.ring_bytes = ring_bytes;
  options.single_copy_bytes = single_copy_bytes;
  options.connect_timeout = std::chrono::seconds(20);
  return std::make_unique<ShmTransport>(options);
}

// Runs body(transport) on `world` threads; returns each rank's exception (null if none).
inline std::vector<std::exception_ptr> run_ranks(TransportKind kind,
                                                 int world,
                                                 const std::function<void(Transport&)>& body,
                                                 size_t ring_bytes = 4096) {
  auto hub = std::make_shared<InProcessHub>(world);
  const std::string name = unique_shm_name();
  MemoryRendezvous rendezvous;
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        std::unique_ptr<Transport> transport;
        if (kind == TransportKind::kInProcess) {
          transport = std::make_unique<InProcessTransport>(hub, rank);
        } else if (kind == TransportKind::kTcp) {
          transport = make_tcp(rank, world, rendezvous);
        } else if (kind == TransportKind::kShm || kind == TransportKind::kShmSingleCopy) {
          transport = make_shm(name, rank, world, ring_bytes,
                               kind == TransportKind::kShm ? 0 : kTestSingleCopyBytes);
        } else {
          std::vector<int> host_of(world);
          for (int r = 0; r < world; ++r) {
            host_of[r] = kind == TransportKind::kHybridPairs     ? r / 2
                         : kind == TransportKind::kHybridStrided ? r % std::max(1, world / 2)
                                                                 : (r < (world + 1) / 2 ? 0 : 1);
          }
          const int host = host_of[rank];
          auto local = make_shm(
              name + "-host" + std::to_string(host), HybridTransport::local_rank_of(host_of, rank),
              HybridTransport::local_size_of(host_of, rank), ring_bytes, kTestSingleCopyBytes,
              HybridTransport::host_ranks_of(host_of, rank));
          transport = std::make_unique<HybridTransport>(HybridTransportOptions{rank, host_of},
                                                        std::move(local),
                                                        make_tcp(rank, world, rendezvous));
        }
        body(*transport);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

inline std::string error_text(const std::exception_ptr& error) {
  if (!error) return "";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "unknown exception";
}

}  // namespace shardwise::collectives::testing
