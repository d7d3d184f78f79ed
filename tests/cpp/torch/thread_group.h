// A process group over the shardwise backend for LibTorch tests whose ranks are threads sharing
// one in-memory store; the short timeout makes a failing rank fail the others fast.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

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
