// CudaLanes: the all-gather and reduce-scatter lanes are high-priority streams from the pool (as
// FSDP2's), the compute lane is the caller's current stream, events are CUDA events (no host
// synchronization anywhere), and keep_alive is the caching allocator's recordStream.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "fsdp/lanes.h"

namespace shardwise::fsdp {
namespace {

// A CUDA event without timing (the cheapest kind), recorded once.
class CudaEvent : public LaneEvent {
 public:
  explicit CudaEvent(const c10::cuda::CUDAStream& stream) {
    const c10::cuda::CUDAGuard on_device(stream.device_index());
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(event_, stream.stream()));
  }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void block(const c10::cuda::CUDAStream& stream) const {
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), event_, 0));
  }

 private:
  cudaEvent_t event_ = nullptr;
};

class CudaLanes : public Lanes {
 public:
  explicit CudaLanes(const at::Device& device)
      : device_(device.index() < 0 ? c10::cuda::current_device() : device.index()),
        all_gather_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)),
        reduce_scatter_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)) {}

  LaneGuard use(Lane lane) override {
    const c10::cuda::CUDAStream target = stream(lane);
    if (depth_ == 0) outer_ = c10::cuda::getCurrentCUDAStream(device_);
    ++depth_;
    auto* guard = new c10::cuda::CUDAStreamGuard(target);
    return LaneGuard(static_cast<void*>(guard), [](void* g) {
      delete static_cast<c10::cuda::CUDAStreamGuard*>(g);
      --depth_;
    });
  }

  LaneEventPtr record(Lane lane) override { return std::make_shared<CudaEvent>(stream(lane)); }

  void wait(Lane waiter, const LaneEventPtr& event) override {
    const auto* cuda = dynamic_cast<const CudaEvent*>(event.get());
    TORCH_CHECK(cuda != nullptr, "FSDP: waiting for an event of other lanes than these");
    cuda->block(stream(waiter));
  }

  void keep_alive(const at::Tensor& tensor, Lane lane) override {
    if (!tensor.defined() || !tensor.is_cuda() || tensor.storage().nbytes() == 0) return;
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), stream(lane));
  }

 private:
  // The compute lane is whatever stream the caller runs on, read outside any of our guards.
  c10::cuda::CUDAStream stream(Lane lane) const {
    switch (lane) {
      case Lane::kAllGather:
        return all_gather_;
      case Lane::kReduceScatter:
        return reduce_scatter_;
      case Lane::kCompute:
        break;
    }
    return depth_ == 0 || !outer_ ? c10::cuda::getCurrentCUDAStream(device_) : *outer_;
  }

  c10::DeviceIndex device_;
  c10::cuda::CUDAStream all_gather_;
  c10::cuda::CUDAStream reduce_scatter_;
  // Per thread (forward runs on the caller's thread, backward on autograd's device thread).
  static thread_local int depth_;
  static thread_local std::optional<c10::cuda::CUDAStream> outer_;
};

thread_local int CudaLanes::depth_ = 0;
thread_local std::optional<c10::cuda::CUDAStream> CudaLanes::outer_;

}  // namespace

std::shared_ptr<Lanes> make_cuda_lanes(const at::Device& device) {
  return std::make_shared<CudaLanes>(device);
}

}  // namespace shardwise::fsdp
