#include "distributed/process_group.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace shardwise::distributed {
namespace {

auto getenv_fn = [](const char* name) { return std::getenv(name); };

c10::intrusive_ptr<c10d::Store> connect_store(const TorchrunEnv& env,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0 && !env.use_agent_store;
  store_options.numWorkers =
      env.use_agent_store ? std::nullopt : std::optional<size_t>(env.world_size);
  store_options.waitWorkers = !env.use_agent_store;
  store_options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "rank ", env.rank, ": could not ",
                store_options.isServer ? "serve" : "reach",
                " the TCPStore at MASTER_ADDR:", "MASTER_PORT = ", env.master_addr, ":",
                env.master_port, " within ", timeout.count(), " ms (", e.what(),
                "); check that every rank was started with the same MASTER_ADDR/MASTER_PORT "
                "and that the port is free on rank 0's host");
  }
  if (!env.use_agent_store) return store;
  return c10::make_intrusive<c10d::PrefixStore>(
      "/worker/attempt_" + std::to_string(env.restart_count), store);
}

}  // namespace

backend::ShardwiseOptions::CudaComm cuda_comm_from(const char* value) {
  using CudaComm = backend::ShardwiseOptions::CudaComm;
  const std::string choice = value == nullptr ? "" : value;
  if (choice.empty() || choice == "auto") return CudaComm::kAuto;
  if (choice == "nccl") return CudaComm::kNccl;
  if (choice == "host") return CudaComm::kHost;
  throw std::invalid_argument("SHARDWISE_CUDA_COMM=" + choice +
                              ": use auto (host memory when ranks share a GPU), nccl or host");
}

collectives::StoreChoice::Kind ring_stores_from(const char* value) {
  using Kind = collectives::StoreChoice::Kind;
  const std::string choice = value == nullptr ? "" : value;
  if (choice.empty() || choice == "auto") return Kind::kMeasured;
  if (choice == "ordinary") return Kind::kOrdinary;
  if (choice == "streaming") return Kind::kStreaming;
  throw std::invalid_argument("SHARDWISE_RING_STORES=" + choice +
                              ": use auto (whichever this rank measures to be faster), ordinary "
                              "or streaming");
}

backend::ShardwiseOptions ProcessGroupOptions::backend_options_from_env() {
  backend::ShardwiseOptions options;
  const int64_t ring = env_int(getenv_fn, "SHARDWISE_RING_BYTES", 0, 0, int64_t{1} << 40);
  if (ring > 0) options.ring_bytes = static_cast<size_t>(ring);
  options.spin =
      std::chrono::microseconds(env_int(getenv_fn, "SHARDWISE_SPIN_US", -1, -1, int64_t{1} << 40));
  options.single_copy_bytes = static_cast<size_t>(
      env_int(getenv_fn, "SHARDWISE_SINGLE_COPY_BYTES", 0, 0, int64_t{1} << 40));
  options.cuda_comm = cuda_comm_from(getenv_fn("SHARDWISE_CUDA_COMM"));
  options.hierarchical = env_int(getenv_fn, "SHARDWISE_HIERARCHICAL", 1, 0, 1) == 1;
  options.ring_stores = ring_stores_from(getenv_fn("SHARDWISE_RING_STORES"));
  if (const char* id = getenv_fn("SHARDWISE_HOST_ID")) {
    TORCH_CHECK_VALUE(*id != '\0',
                      "SHARDWISE_HOST_ID is set but empty: unset it (the host name "
                      "is used) or set it to this process's host");
    options.host_id = id;
  }
  return options;
}

c10::intrusive_ptr<c10d::ProcessGroup> new_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const std::vector<int>& ranks,
                                                 int rank,
                                                 const std::string& name,
                                                 const ProcessGroupOptions& options) {
  TORCH_CHECK(!ranks.empty() && std::is_sorted(ranks.begin(), ranks.end()) &&
                  std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end(),
              "new_group(", name, "): ranks must be distinct and ascending");
  const auto it = std::find(ranks.begin(), ranks.end(), rank);
  TORCH_CHECK(it != ranks.end(), "new_group(", name, "): rank ", rank,
              " is not one of the group's ranks; only members create a group");
  const int group_rank = static_cast<int>(it - ranks.begin());
  const int group_size = static_cast<int>(ranks.size());
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("shardwise/" + name, store);
  backend::ShardwiseOptions backend_options = options.backend;
  backend_options.timeout = options.timeout;
  auto backend = c10::make_intrusive<backend::ShardwiseBackend>(prefixed, group_rank, group_size,
                                                                backend_options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(prefixed, group_rank, group_size);
  // One backend for both device types: CUDA tensors go to its NCCL communicator.
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    group->setBackend(device, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  }
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  group->setGroupName(name);
  return group;
}

World init_from_env(const ProcessGroupOptions& options) {
  World world;
  world.env = read_torchrun_env();
  world.store = connect_store(world.env, options.timeout);
  std::vector<int> everyone(world.env.world_size);
  for (int r = 0; r < world.env.world_size; ++r) everyone[r] = r;
  world.group = new_group(world.store, everyone, world.env.rank, "world", options);
  return world;
}

World single_process_world(const ProcessGroupOptions& options) {
  World world;
  world.env.master_addr = "localhost";
  world.store = c10::make_intrusive<c10d::HashStore>();
  world.group = new_group(world.store, {0}, 0, "world", options);
  return world;
}

World init_from_env_or_single(const ProcessGroupOptions& options) {
  const char* rank = std::getenv("RANK");
  return rank != nullptr && *rank != '\0' ? init_from_env(options) : single_process_world(options);
}

}  // namespace shardwise::distributed
