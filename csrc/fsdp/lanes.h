// Where an FSDP unit's work runs, and how it is ordered (FSDP2's stream scheme).
//
// Three lanes: `kCompute` (the caller's current stream: forward, backward, the optimizer, the
// copy-outs), `kAllGather` (copy-in and all-gather, so a prefetched gather overlaps compute) and
// `kReduceScatter` (copy-in and reduce-scatter of gradients, overlapping the rest of backward).
// The unit orders them with events: the all-gather lane waits for compute before reading the
// shards (the optimizer wrote them), compute waits for the gather before the copy-out, the
// reduce-scatter lane waits for compute before reading gradients, and compute waits for the
// reduction before accumulating into gradient shards. A buffer allocated on one lane and used on
// another is kept alive for the other (record_stream) before it is dropped, so the caching
// allocator never hands its memory out while a collective may still read it.
//
// CudaLanes (lanes_cuda.cpp) makes the lanes streams from the pool and the events CUDA events.
// HostLanes (CPU): everything runs on the host in issue order, so every call costs nothing.
// RecordingLanes: a HostLanes that also replays every call, and the buffer lives and accesses the
// unit declares beside each op, into fsdp/stream_order.h's checker, so the CUDA ordering of the
// unit's real code paths is tested on CPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fsdp/stream_order.h"

namespace shardwise::fsdp {

enum class Lane : int { kCompute = 0, kAllGather = 1, kReduceScatter = 2 };
constexpr int kLaneCount = 3;
const char* lane_name(Lane lane);

class LaneEvent {
 public:
  virtual ~LaneEvent() = default;
};
using LaneEventPtr = std::shared_ptr<LaneEvent>;
// Work queued while it lives runs on the lane it was made for; the previous lane after.
using LaneGuard = std::shared_ptr<void>;

class Lanes {
 public:
  virtual ~Lanes() = default;
  virtual LaneGuard use(Lane lane) = 0;
  virtual LaneEventPtr record(Lane lane) = 0;  // after the lane's work so far
  virtual void wait(Lane waiter, const LaneEventPtr& event) = 0;
  virtual void keep_alive(const at::Tensor& tensor, Lane lane) = 0;  // record_stream

  // Declarations beside each op (what RecordingLanes checks; nothing elsewhere).
  virtual void allocated(const at::Tensor& /*tensor*/, Lane /*lane*/, const char* /*name*/) {}
  virtual void accessed(Lane /*lane*/,
                        const char* /*what*/,
                        const std::vector<at::Tensor>& /*reads*/,
                        const std::vector<at::Tensor>& /*writes*/) {}
  virtual void freed(const at::Tensor& /*tensor*/) {}
};

// The lanes for parameters on `device`: CudaLanes on CUDA, HostLanes elsewhere.
std::shared_ptr<Lanes> make_lanes(const at::Device& device);
// One set of lanes per device for the process, for units made outside an engine (fully_shard:
// units of one model made one by one still share one all-gather and one reduce-scatter stream).
std::shared_ptr<Lanes> shared_lanes(const at::Device& device);
// CudaLanes (defined in lanes_cuda.cpp; in builds without CUDA, an error naming the build).
std::shared_ptr<Lanes> make_cuda_lanes(const at::Device& device);

class HostLanes : public Lanes {
 public:
  LaneGuard use(Lane lane) override;
  LaneEventPtr record(Lane lane) override;
  void wait(Lane waiter, const LaneEventPtr& event) override;
  void keep_alive(const at::Tensor& tensor, Lane lane) override;
};

class RecordingLanes : public HostLanes {
 public:
  RecordingLanes();
  LaneGuard use(Lane lane) override;
  LaneEventPtr record(Lane lane) override;
  void wait(Lane waiter, const LaneEventPtr& event) override;
  void keep_alive(const at::Tensor& tensor, Lane lane) override;
  void allocated(const at::Tensor& tensor, Lane lane, const char* name) override;
  void accessed(Lane lane,
                const char* what,
                const std::vector<at::Tensor>& reads,
                const std::vector<at::Tensor>& writes) override;
  void freed(const at::Tensor& tensor) override;

  // The checker's findings, plus ops declared on a lane other than the current one.
  std::vector<std::string> errors() const;
  int64_t operations() const;

 private:
  std::vector<StreamOrder::Buffer> buffers(const std::vector<at::Tensor>& tensors) const;

  mutable std::mutex mutex_;
  StreamOrder order_;
  std::vector<Lane> current_;  // the guards' stack; empty: compute
  std::vector<std::string> lane_errors_;
};

}  // namespace shardwise::fsdp
