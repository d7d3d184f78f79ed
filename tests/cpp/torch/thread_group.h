// A process group over the shardwise backend for LibTorch tests whose ranks are threads sharing
// one in-memory store; the short timeout makes a failing rank fail the others fast.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "backend/shardwise_backend.hpp"

inline c10::intrusive_ptr<c10d::ProcessGroup> make_thread_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world, const std::string& prefix) {
  shardwise::backend::ShardwiseOptions options;
  options.timeout = std::chrono::seconds(30);
  auto backend = c10::make_intrusive<shardwise::backend::ShardwiseBackend>(
      c10::make_intrusive<c10d::PrefixStore>(prefix, store), rank, world, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return group;
}

// Runs fn(rank, store) on `world` threads sharing one in-memory store (for tests that make
// their own sub-groups with make_thread_group); fails the calling test with any rank's exception
// (each rank's message, by rank).
inline void on_threads_with_store(
    int world, const std::function<void(int, const c10::intrusive_ptr<c10d::Store>&)>& fn) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank, store);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) ASSERT_EQ(errors[rank], "") << "rank " << rank;
}

// Runs fn(rank, group) on `world` thread ranks of one group over the shardwise backend.
inline void on_thread_ranks(
    int world,
    const std::string& prefix,
    const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& fn) {
  on_threads_with_store(world, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    fn(rank, make_thread_group(store, rank, world, prefix));
  });
}
