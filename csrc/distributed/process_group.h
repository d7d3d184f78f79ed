// Process groups for LibTorch programs, without Python: the world from torchrun's environment
// (a TCPStore at MASTER_ADDR:MASTER_PORT, then the shardwise backend for CPU tensors and, in a
// CUDA build, for CUDA tensors too, which it runs on NCCL), and groups over subsets of the world.
//
//   auto world = shardwise::distributed::init_from_env();   // under torchrun --no-python
//   world.group->allreduce(tensors)->wait();
//
// Every failure names the rank and what failed: a missing variable before anything connects, a
// store nobody serves after `timeout`, a peer that does not join the group.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "backend/shardwise_backend.hpp"
#include "distributed/torchrun_env.h"

namespace shardwise::distributed {

struct ProcessGroupOptions {
  // Connecting to the store, joining a group, and each collective.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  // Ring sizes, polling and the CUDA path; options_from_env() reads the SHARDWISE_* variables
  // the Python backend reads (SHARDWISE_RING_BYTES, SHARDWISE_SPIN_US,
  // SHARDWISE_SINGLE_COPY_BYTES, SHARDWISE_CUDA_COMM, SHARDWISE_HIERARCHICAL,
  // SHARDWISE_RING_STORES, SHARDWISE_HOST_ID).
  backend::ShardwiseOptions backend = backend_options_from_env();

  static backend::ShardwiseOptions backend_options_from_env();
};

// SHARDWISE_RING_STORES's value (unset or "auto", "ordinary", "streaming"); anything else: an
// error naming the choices.
collectives::StoreChoice::Kind ring_stores_from(const char* value);

// SHARDWISE_CUDA_COMM's value (unset or "auto", "nccl", "host"); anything else: an error naming
// the choices.
backend::ShardwiseOptions::CudaComm cuda_comm_from(const char* value);

struct World {
  TorchrunEnv env;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // every rank
  int rank() const { return env.rank; }
  int size() const { return env.world_size; }
};

// Reads torchrun's variables (distributed/torchrun_env.h), connects to (rank 0: serves) the
// store and creates the world group.
World init_from_env(const ProcessGroupOptions& options = {});

// A world of this process alone (an in-memory store), for running without torchrun.
World single_process_world(const ProcessGroupOptions& options = {});

// init_from_env() under torchrun (RANK is set), else single_process_world().
World init_from_env_or_single(const ProcessGroupOptions& options = {});

// A group over `store` of `ranks` (global ranks, ascending, holding `rank`); `name` keys its
// rendezvous and must be the same on its members and differ from every other group's.
// Collective over the members only.
c10::intrusive_ptr<c10d::ProcessGroup> new_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const std::vector<int>& ranks,
                                                 int rank,
                                                 const std::string& name,
                                                 const ProcessGroupOptions& options = {});

}  // namespace shardwise::distributed
