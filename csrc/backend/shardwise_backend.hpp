// The `shardwise` torch.distributed backend: a c10d::Backend whose collectives run the
// algorithms of csrc/collectives/: over shared memory when all ranks share a host, over TCP
// otherwise (SHARDWISE_TRANSPORT=auto|shm|tcp; SHARDWISE_SOCKET_IFNAME picks the interface).
//
// Operations are queued as jobs and run in issue order on one worker thread per lane (so
// async_op=True overlaps with compute): collectives on one lane, point-to-point sends and
// receives on a lane each over a second transport, so a send blocked on a full ring never stops
// the matching receive. Each job gets a sequence number (the same on every rank, since ranks
// issue collectives in the same order) that tags its messages; a job that fails aborts the
// transport, so peers fail fast, and leaves the backend broken: later jobs fail with the first
// error, which names the rank, the operation, its sequence number and the peer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "backend/nccl_comm.hpp"
#include "backend/work.hpp"
#include "collectives/collectives.h"
#include "collectives/store_choice.h"
#include "collectives/transport.h"

namespace shardwise::backend {

struct ShardwiseOptions {
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  size_t ring_bytes = size_t{1} << 20;      // per ordered pair, collectives (L2-sized wins)
  size_t p2p_ring_bytes = size_t{1} << 20;  // per ordered pair, send/recv
  size_t max_segment_bytes = size_t{1} << 20;
  // How long a waiting thread polls before it blocks: a rank on shared memory, an idle lane and
  // a caller in Work::wait(). Negative: the defaults (common/spin_wait.h), which poll only when
  // the ranks (for lanes and callers: twice the ranks) do not outnumber the cores.
  std::chrono::microseconds spin{-1};
  // Shared-memory messages of at least this many bytes are read straight from the sender's
  // memory (see ShmTransportOptions::single_copy_bytes); 0: never.
  size_t single_copy_bytes = 0;
  // How large messages are written into the rings (collectives/store_choice.h).
  collectives::StoreChoice::Kind ring_stores = collectives::StoreChoice::Kind::kMeasured;
  size_t small_message_bytes = size_t{16} << 10;
  // A group spanning hosts all-reduces, reduce-scatters and all-gathers within hosts and across
  // them (CollectiveOptions::hierarchical).
  bool hierarchical = true;
  // This process's host as the link choice sees it (ranks that share it share memory); empty:
  // its host name. As NCCL_HOSTID for NCCL: for machines whose host names repeat, or to run one
  // machine's ranks as if on several hosts.
  std::string host_id;
  // Collectives whose outputs total at most this many bytes run in the caller's thread when
  // nothing is queued before them: two thread hand-offs cost more than such a message moves.
  size_t inline_bytes = size_t{256} << 10;
  // How CUDA tensors travel: through NCCL, through host memory (backend/host_staged_comm.hpp),
  // or auto: host memory when two ranks of the group share a GPU (NCCL refuses that), else NCCL.
  enum class CudaComm { kAuto, kNccl, kHost };
  CudaComm cuda_comm = CudaComm::kAuto;
};

// Seconds this process's shardwise backends have spent running communication (collectives and
// send/recv, summed over lanes and groups; asynchronous work may overlap with compute). The
// training command reports it per step as the communication share.
double communication_seconds();

class ShardwiseBackend : public c10d::Backend {
 public:
  ShardwiseBackend(const c10::intrusive_ptr<c10d::Store>& store,
                   int rank,
                   int size,
                   ShardwiseOptions options);
  ~ShardwiseBackend() override;

  const std::string getBackendName() const override { return "shardwise"; }
  // The collectives issued so far (the same on every rank of a group that is in step):
  // TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper compares it across ranks.
  uint64_t getSequenceNumberForGroup() override { return sequence_.load(); }

  using Tensors = std::vector<at::Tensor>;
  using Work = c10::intrusive_ptr<c10d::Work>;
  Work broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override;
  // Deterministic all-reduce / reduce-scatter of floating-point CPU tensors (SUM or AVG): each
  // element summed as the balanced binary tree over the rank index (collectives/tree_reduce.cc);
  // the group size must be a power of two. distributed/tree_reduce.h is the entry point.
  Work tree_allreduce(at::Tensor& tensor, const c10d::AllreduceOptions& opts);
  Work tree_reduce_scatter(at::Tensor& output,
                           at::Tensor& input,
                           const c10d::ReduceScatterOptions& opts);
  Work allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override;
  Work allreduce_coalesced(Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  Work reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override;
  Work allgather(std::vector<Tensors>& outputs,
                 Tensors& inputs,
                 const c10d::AllgatherOptions& opts) override;
  Work _allgather_base(at::Tensor& output,
                       at::Tensor& input,
                       const c10d::AllgatherOptions& opts) override;
  Work allgather_into_tensor_coalesced(Tensors& outputs,
                                       Tensors& inputs,
                                       const c10d::AllgatherOptions& opts) override;
  Work gather(std::vector<Tensors>& outputs,
              Tensors& inputs,
              const c10d::GatherOptions& opts) override;
  Work scatter(Tensors& outputs,
               std::vector<Tensors>& inputs,
               const c10d::ScatterOptions& opts) override;
  Work reduce_scatter(Tensors& outputs,
                      std::vector<Tensors>& inputs,
                      const c10d::ReduceScatterOptions& opts) override;
  Work _reduce_scatter_base(at::Tensor& output,
                            at::Tensor& input,
                            const c10d::ReduceScatterOptions& opts) override;
  Work reduce_scatter_tensor_coalesced(Tensors& outputs,
                                       Tensors& inputs,
                                       const c10d::ReduceScatterOptions& opts) override;
  Work alltoall_base(at::Tensor& output,
                     at::Tensor& input,
                     std::vector<int64_t>& output_splits,
                     std::vector<int64_t>& input_splits,
                     const c10d::AllToAllOptions& opts) override;
  Work alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) override;
  Work send(Tensors& tensors, int dst_rank, int tag) override;
  Work recv(Tensors& tensors, int src_rank, int tag) override;
  // The first message from any other rank (gloo's contract; the Work's sourceRank() names it).
  Work recvAnysource(Tensors& tensors, int tag) override;
  Work barrier(const c10d::BarrierOptions& opts) override;
  // Rank 0 names the ranks that did not arrive within opts.timeout (monitored_barrier.cpp).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  // Every rank's inputs, each into the output list of that rank (one gather of their bytes).
  Work allgather_coalesced(std::vector<Tensors>& output_lists,
                           Tensors& inputs,
                           const c10d::AllgatherOptions& opts) override;

 private:
  // The next message of `peer` into `tensors`, its sequence number taken as it runs (recv lane).
  void receive_from(collectives::Transport& t,
                    int peer,
                    Tensors& tensors,
                    const collectives::CollectiveOptions& base);
  using Body = std::function<void(collectives::Transport&, const collectives::CollectiveOptions&)>;
  struct Job {
    c10::intrusive_ptr<ShardwiseWork> work;
    collectives::Tag tag;
    std::chrono::milliseconds timeout;
    Body body;
    uint64_t bytes = 0;  // the outputs' payload (op_log.hpp counts it)
  };
  struct Lane {
    collectives::Transport* transport = nullptr;
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<Job> jobs;
    bool busy = false;      // a job is running (on the lane's thread or inline in a caller's)
    bool sleeping = false;  // the lane's thread blocks on `ready` (else it polls `changes`)
    std::atomic<uint64_t> changes{0};  // bumped when a job is queued or an inline job ends
    std::thread thread;
  };

  Work enqueue(Lane& lane,
               c10d::OpType type,
               collectives::Kind kind,
               uint64_t sequence,
               Tensors outputs,
               const Tensors& inputs,
               std::chrono::milliseconds timeout,
               Body body,
               int64_t inline_up_to = -1);  // run in the caller's thread up to these bytes
  // A collective in issue order. It runs in the caller's thread when nothing is queued before it
  // and either the caller waits at once (async_op=False: torch sets opts.asyncOp) or its outputs
  // are at most options_.inline_bytes; else on the lane's thread.
  // `outputs` complete the Work's future; `inputs` are what its profiler event records.
  template <typename Options>
  Work collective(c10d::OpType type,
                  collectives::Kind kind,
                  Tensors outputs,
                  const Tensors& inputs,
                  const Options& opts,
                  Body body) {
    return collective(type, kind, std::move(outputs), inputs, opts.timeout, opts.asyncOp,
                      std::move(body));
  }
  Work collective(c10d::OpType type,
                  collectives::Kind kind,
                  Tensors outputs,
                  const Tensors& inputs,
                  std::chrono::milliseconds timeout,
                  bool async_op,
                  Body body);
  // all_reduce of sparse COO tensors (SUM; sparse_allreduce.cpp).
  Work sparse_allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts);
  void run_lane(Lane& lane);
  static void changed(Lane& lane);  // with lane.mutex held
  void run_job(Lane& lane, Job& job);
  std::chrono::milliseconds timeout_or_default(std::chrono::milliseconds timeout) const;
  // CUDA tensors: runs body on the NCCL communicator, or the host-staged one (created on first
  // use, collectively; see ShardwiseOptions::cuda_comm) in the caller's thread, stream-ordered;
  // the returned work is already complete.
  Work nccl(c10d::OpType type,
            Tensors outputs,
            const Tensors& inputs,  // the first one's device picks the communicator
            const std::function<void(NcclComm&)>& body);
  std::unique_ptr<NcclComm> make_cuda_comm(const at::Device& device);

  ShardwiseOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::mutex nccl_mutex_;
  std::unique_ptr<NcclComm> nccl_;
  std::unique_ptr<collectives::Transport> transport_;      // collectives
  std::unique_ptr<collectives::Transport> p2p_transport_;  // send/recv
  std::atomic<uint64_t> sequence_{0};
  uint64_t monitored_barriers_ = 0;  // names each monitored barrier's store keys
  // Per-peer p2p sequence numbers. receives_from_ is read and advanced by the receive lane as it
  // runs each receive, so a receive from any source takes the next number of whichever peer
  // it hears from, in issue order with the receives from named peers.
  std::vector<uint64_t> sends_to_, receives_from_;
  std::mutex p2p_mutex_;
  std::mutex failure_mutex_;
  std::exception_ptr failure_;
  std::atomic<bool> stopping_{false};
  std::chrono::microseconds spin_;  // how long idle lanes and waiters poll before they block
  Lane collective_lane_, send_lane_, recv_lane_;
};

}  // namespace shardwise::backend
