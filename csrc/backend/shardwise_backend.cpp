// Set-up, lanes and error handling of the shardwise backend; the operations themselves are in
// shardwise_backend_ops.cpp.
#include "backend/shardwise_backend.hpp"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "backend/host_staged_comm.hpp"
#include "backend/op_log.hpp"
#include "collectives/hybrid_transport.h"
#include "collectives/inprocess_transport.h"
#include "collectives/shm_transport.h"
#include "collectives/tcp_transport.h"
#include "common/spin_wait.h"

namespace shardwise::backend {
namespace {

std::atomic<int64_t> communication_ns{0};

std::string random_hex() {
  std::random_device device;
  std::ostringstream out;
  for (int i = 0; i < 4; ++i) out << std::hex << std::setw(8) << std::setfill('0') << device();
  return out.str();
}

std::string store_get(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key) {
  const std::vector<uint8_t> bytes = store->get(key);
  return std::string(bytes.begin(), bytes.end());
}

// This process's host as the link choice sees it: ShardwiseOptions::host_id, else the host name.
std::string host_name(const ShardwiseOptions& options) {
  if (!options.host_id.empty()) return options.host_id;
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

// The host of every rank, as indices in order of first appearance (ranks exchange host names
// through the store).
std::vector<int> hosts_of_ranks(const c10::intrusive_ptr<c10d::Store>& store,
                                int rank,
                                int size,
                                const ShardwiseOptions& options) {
  const std::string mine = host_name(options);
  store->set("shardwise/host/" + std::to_string(rank),
             std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> names;
  std::vector<int> host_of(size);
  for (int r = 0; r < size; ++r) {
    const std::string name = store_get(store, "shardwise/host/" + std::to_string(r));
    const auto found = std::find(names.begin(), names.end(), name);
    host_of[r] = static_cast<int>(found - names.begin());
    if (found == names.end()) names.push_back(name);
  }
  return host_of;
}

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// SHARDWISE_TRANSPORT: auto (per peer: shared memory on this host, TCP to other hosts), shm or tcp
// (one link for every peer). Returns the host of every rank as the transport should see it.
std::vector<int> transport_hosts(const c10::intrusive_ptr<c10d::Store>& store,
                                 int rank,
                                 int size,
                                 const ShardwiseOptions& options) {
  const std::string choice = environment("SHARDWISE_TRANSPORT");
  TORCH_CHECK_VALUE(choice.empty() || choice == "auto" || choice == "shm" || choice == "tcp",
                    "SHARDWISE_TRANSPORT='", choice, "'; valid: auto, shm, tcp");
  std::vector<int> host_of = hosts_of_ranks(store, rank, size, options);
  const bool one_host = std::all_of(host_of.begin(), host_of.end(), [](int h) { return h == 0; });
  TORCH_CHECK_VALUE(choice != "shm" || one_host, "SHARDWISE_TRANSPORT=shm but the ranks of this ",
                    "group run on several hosts; use auto or tcp");
  if (choice == "tcp") std::iota(host_of.begin(), host_of.end(), 0);  // every rank its own host
  return host_of;
}

std::unique_ptr<collectives::Transport> connect_tcp(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank,
                                                    int size,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& purpose) {
  collectives::TcpTransportOptions options;
  options.rank = rank;
  options.size = size;
  options.key_prefix = "shardwise/tcp/" + purpose;
  options.connect_timeout = timeout;
  // Bind to the interface named by SHARDWISE_SOCKET_IFNAME, else the one that reaches the master.
  options.bind_address = collectives::local_address_for(environment("MASTER_ADDR"),
                                                        environment("SHARDWISE_SOCKET_IFNAME"));
  collectives::Rendezvous rendezvous{
      [&store](const std::string& key, const std::string& value) {
        store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      },
      [&store](const std::string& key) { return store_get(store, key); }};
  return std::make_unique<collectives::TcpTransport>(options, rendezvous);
}

std::unique_ptr<collectives::Transport> connect_shm(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank,
                                                    int size,
                                                    const ShardwiseOptions& shardwise,
                                                    size_t ring_bytes,
                                                    const std::string& purpose,
                                                    std::vector<int> group_ranks = {}) {
  const std::string key = "shardwise/shm/" + purpose;
  std::string name;
  if (rank == 0) {  // unique and unguessable; unlinked again once every rank has attached
    name = "/shardwise-" + std::to_string(::getpid()) + "-" + random_hex();
    store->set(key, std::vector<uint8_t>(name.begin(), name.end()));
  } else {
    name = store_get(store, key);
  }
  collectives::ShmTransportOptions options;
  options.name = name;
  options.rank = rank;
  options.size = size;
  options.ring_bytes = ring_bytes;
  options.connect_timeout = shardwise.timeout;
  options.spin = shardwise.spin;
  options.single_copy_bytes = shardwise.single_copy_bytes;
  options.stores = shardwise.ring_stores;
  options.group_ranks = std::move(group_ranks);
  // A fifth of the timeout, at most 5 s: time for a rank blocked across the network to say so.
  options.abort_grace = std::min<std::chrono::milliseconds>(
      std::chrono::seconds(5),
      std::chrono::duration_cast<std::chrono::milliseconds>(shardwise.timeout) / 5);
  return std::make_unique<collectives::ShmTransport>(options);
}

// One transport for the group: shared memory when every rank shares this host, TCP when every rank
// is alone on its host, otherwise a hybrid with shared memory to this host's ranks and TCP beyond.
std::unique_ptr<collectives::Transport> connect(const c10::intrusive_ptr<c10d::Store>& store,
                                                const std::vector<int>& host_of,
                                                int rank,
                                                const ShardwiseOptions& shardwise,
                                                size_t ring_bytes,
                                                const std::string& purpose) {
  using collectives::HybridTransport;
  const int size = static_cast<int>(host_of.size());
  const int local_size = HybridTransport::local_size_of(host_of, rank);
  if (local_size == size) return connect_shm(store, rank, size, shardwise, ring_bytes, purpose);
  auto remote = connect_tcp(store, rank, size, shardwise.timeout, purpose);
  if (local_size == 1) return remote;
  const int host = host_of[rank];
  auto local = connect_shm(store, HybridTransport::local_rank_of(host_of, rank), local_size,
                           shardwise, ring_bytes, purpose + "/host" + std::to_string(host),
                           HybridTransport::host_ranks_of(host_of, rank));
  return std::make_unique<HybridTransport>(collectives::HybridTransportOptions{rank, host_of},
                                           std::move(local), std::move(remote));
}

}  // namespace

ShardwiseBackend::ShardwiseBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                   int rank,
                                   int size,
                                   ShardwiseOptions options)
    : c10d::Backend(rank, size),
      options_(options),
      store_(store),
      sends_to_(size, 0),
      receives_from_(size, 0),
      // A lane's thread and a caller that waits on it poll only when every rank's two threads can
      // have a core each: else the poller takes the core the other needs.
      spin_(options.spin.count() >= 0 ? options.spin : shardwise::default_spin(2 * size)) {
  if (size > 1) {
    const std::vector<int> host_of = transport_hosts(store, rank, size, options_);
    transport_ = connect(store, host_of, rank, options_, options_.ring_bytes, "collectives");
    p2p_transport_ = connect(store, host_of, rank, options_, options_.p2p_ring_bytes, "p2p");
  } else {  // a group of one: every collective is local
    auto hub = std::make_shared<collectives::InProcessHub>(1);
    transport_ = std::make_unique<collectives::InProcessTransport>(hub, 0);
    p2p_transport_ = std::make_unique<collectives::InProcessTransport>(hub, 0);
  }
  collective_lane_.transport = transport_.get();
  send_lane_.transport = p2p_transport_.get();
  recv_lane_.transport = p2p_transport_.get();
  for (Lane* lane : {&collective_lane_, &send_lane_, &recv_lane_}) {
    lane->thread = std::thread([this, lane] { run_lane(*lane); });
  }
  if (debug_info()) {
    log_info("rank " + std::to_string(rank) + " of " + std::to_string(size) +
             ": backend up (ring " + std::to_string(options_.ring_bytes) + " bytes, inline " +
             std::to_string(options_.inline_bytes) + " bytes, timeout " +
             std::to_string(options_.timeout.count()) + " ms, spin " +
             std::to_string(spin_.count()) + " us)");
  }
}

ShardwiseBackend::~ShardwiseBackend() {
  stopping_ = true;
  for (Lane* lane : {&collective_lane_, &send_lane_, &recv_lane_}) {
    {
      std::lock_guard<std::mutex> lock(lane->mutex);
    }
    lane->ready.notify_all();
    if (lane->thread.joinable()) lane->thread.join();
  }
}

std::chrono::milliseconds ShardwiseBackend::timeout_or_default(
    std::chrono::milliseconds timeout) const {
  return timeout == c10d::kUnsetTimeout ? options_.timeout : timeout;
}

ShardwiseBackend::Work ShardwiseBackend::enqueue(Lane& lane,
                                                 c10d::OpType type,
                                                 collectives::Kind kind,
                                                 uint64_t sequence,
                                                 Tensors outputs,
                                                 const Tensors& inputs,
                                                 std::chrono::milliseconds timeout,
                                                 Body body,
                                                 int64_t inline_up_to) {
  int64_t bytes = 0;  // the outputs' payload: decides inlining, counted by op_log
  for (const auto& t : outputs) bytes += t.numel() * t.element_size();
  auto work =
      c10::make_intrusive<ShardwiseWork>(rank_, type, sequence, std::move(outputs), inputs, spin_);
  Job job{work, collectives::make_tag(kind, sequence), timeout_or_default(timeout), std::move(body),
          static_cast<uint64_t>(bytes)};
  {
    std::lock_guard<std::mutex> lock(lane.mutex);
    if (bytes > inline_up_to || !lane.jobs.empty() || lane.busy) {  // keep issue order: queue
      lane.jobs.push_back(std::move(job));
      changed(lane);
      return work;
    }
    lane.busy = true;
  }
  run_job(lane, job);
  std::lock_guard<std::mutex> lock(lane.mutex);
  lane.busy = false;
  if (!lane.jobs.empty()) changed(lane);  // queued behind this one: the lane may take them now
  return work;
}

void ShardwiseBackend::changed(Lane& lane) {
  lane.changes.fetch_add(1, std::memory_order_release);
  if (lane.sleeping) lane.ready.notify_one();
}

ShardwiseBackend::Work ShardwiseBackend::collective(c10d::OpType type,
                                                    collectives::Kind kind,
                                                    Tensors outputs,
                                                    const Tensors& inputs,
                                                    std::chrono::milliseconds timeout,
                                                    bool async_op,
                                                    Body body) {
  const int64_t inline_up_to =
      async_op ? static_cast<int64_t>(options_.inline_bytes) : std::numeric_limits<int64_t>::max();
  return enqueue(collective_lane_, type, kind, sequence_++, std::move(outputs), inputs, timeout,
                 std::move(body), inline_up_to);
}

ShardwiseBackend::Work ShardwiseBackend::nccl(c10d::OpType type,
                                              Tensors outputs,
                                              const Tensors& inputs,
                                              const std::function<void(NcclComm&)>& body) {
  std::lock_guard<std::mutex> lock(nccl_mutex_);
  if (!nccl_) nccl_ = make_cuda_comm(inputs.at(0).device());
  body(*nccl_);
  auto work = c10::make_intrusive<ShardwiseWork>(rank_, type, 0, std::move(outputs), inputs);
  work->finish(nullptr);
  return work;
}

std::unique_ptr<NcclComm> ShardwiseBackend::make_cuda_comm(const at::Device& device) {
  using CudaComm = ShardwiseOptions::CudaComm;
  bool host = options_.cuda_comm == CudaComm::kHost;
  if (options_.cuda_comm == CudaComm::kAuto && size_ > 1) {
    host = ranks_share_a_device(store_, rank_, size_, cuda_device_id(device));
  }
  if (host) return std::make_unique<HostStagedComm>(*this);
  return make_nccl_comm(store_, rank_, size_, device);
}

// The lane's thread: takes jobs in order. Between jobs it polls for spin_ (a job often follows
// soon, and a futex wake-up costs more than a small collective), then blocks on `ready`.
void ShardwiseBackend::run_lane(Lane& lane) {
  auto runnable = [&] { return stopping_ || (!lane.jobs.empty() && !lane.busy); };
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(lane.mutex);
      if (!runnable()) {
        const uint64_t seen = lane.changes.load(std::memory_order_acquire);
        lock.unlock();
        spin_until(
            [&] { return stopping_ || lane.changes.load(std::memory_order_acquire) != seen; },
            spin_);
        lock.lock();
      }
      lane.sleeping = true;
      lane.ready.wait(lock, runnable);
      lane.sleeping = false;
      if (lane.jobs.empty()) return;  // stopping, nothing left
      if (lane.busy) continue;        // stopping, but an inline job still runs: wait for it
      job = std::move(lane.jobs.front());
      lane.jobs.pop_front();
      lane.busy = true;
    }
    run_job(lane, job);
    std::lock_guard<std::mutex> lock(lane.mutex);
    lane.busy = false;
  }
}

void ShardwiseBackend::run_job(Lane& lane, Job& job) {
  std::exception_ptr earlier;
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    earlier = failure_;
  }
  if (earlier) {
    job.work->finish(earlier);
    return;
  }
  try {
    collectives::CollectiveOptions options;
    options.tag = job.tag;
    options.deadline = collectives::Clock::now() + job.timeout;
    options.max_segment_bytes = options_.max_segment_bytes;
    options.small_message_bytes = options_.small_message_bytes;
    options.hierarchical = options_.hierarchical;
    const auto start = std::chrono::steady_clock::now();
    job.body(*lane.transport, options);
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
    communication_ns += ns;
    record_op(static_cast<collectives::Kind>(job.tag.kind), rank_, job.tag.sequence, job.bytes, ns);
    job.work->finish(nullptr);
  } catch (const std::exception& e) {
    const std::string what =
        std::string(collectives::kind_name(job.tag.kind)) + " #" + std::to_string(job.tag.sequence);
    const std::string message =
        "shardwise backend: rank " + std::to_string(rank_) + ": " + what + " failed: " + e.what();
    if (lane.transport != nullptr) lane.transport->abort(message);
    auto error = std::make_exception_ptr(
        c10::DistBackendError(c10::SourceLocation{__func__, __FILE__, __LINE__}, message));
    {
      std::lock_guard<std::mutex> lock(failure_mutex_);
      if (!failure_) failure_ = error;
    }
    job.work->finish(error);
  }
}

double communication_seconds() { return static_cast<double>(communication_ns.load()) * 1e-9; }

}  // namespace shardwise::backend
