// Threads as ranks: runs one function per rank on its own thread, each with its own transport
// (in-process queues or a real shared-memory segment), and collects every rank's exception.
#pragma once

#include <unistd.h>

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

#include "collectives/inprocess_transport.h"
#include "collectives/shm_transport.h"
#include "collectives/tcp_transport.h"

namespace shardwise::collectives::testing {

enum class TransportKind { kInProcess, kShm, kTcp };

inline const char* kind_label(TransportKind kind) {
  return kind == TransportKind::kShm ? "shm" : kind == TransportKind::kTcp ? "tcp" : "inproc";
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
          TcpTransportOptions options;
          options.rank = rank;
          options.size = world;
          options.connect_timeout = std::chrono::seconds(20);
          transport = std::make_unique<TcpTransport>(options, rendezvous.view());
        } else {
          ShmTransportOptions options;
          options.name = name;
          options.rank = rank;
          options.size = world;
          options.ring_bytes = ring_bytes;
          options.connect_timeout = std::chrono::seconds(20);
          transport = std::make_unique<ShmTransport>(options);
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
