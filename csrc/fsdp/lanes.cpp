#include "fsdp/lanes.h"

#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <string>

namespace shardwise::fsdp {
namespace {

class RecordedEvent : public LaneEvent {
 public:
  explicit RecordedEvent(int id) : id(id) {}
  int id;
};

StreamOrder::Buffer buffer_of(const at::Tensor& tensor) {
  return reinterpret_cast<StreamOrder::Buffer>(tensor.storage().unsafeGetStorageImpl());
}

}  // namespace

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::kCompute:
      return "compute";
    case Lane::kAllGather:
      return "all-gather";
    case Lane::kReduceScatter:
      return "reduce-scatter";
  }
  return "?";
}

std::shared_ptr<Lanes> make_lanes(const at::Device& device) {
  if (device.is_cuda()) return make_cuda_lanes(device);
  return std::make_shared<HostLanes>();
}

std::shared_ptr<Lanes> shared_lanes(const at::Device& device) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<Lanes>> by_device;
  std::lock_guard<std::mutex> lock(mutex);
  std::weak_ptr<Lanes>& slot = by_device[device.str()];
  std::shared_ptr<Lanes> lanes = slot.lock();
  if (!lanes) {
    lanes = make_lanes(device);
    slot = lanes;
  }
  return lanes;
}

LaneGuard HostLanes::use(Lane) { return nullptr; }
LaneEventPtr HostLanes::record(Lane) { return nullptr; }
void HostLanes::wait(Lane, const LaneEventPtr&) {}
void HostLanes::keep_alive(const at::Tensor&, Lane) {}

RecordingLanes::RecordingLanes()
    : order_({lane_name(Lane::kCompute), lane_name(Lane::kAllGather),
              lane_name(Lane::kReduceScatter)}) {}

LaneGuard RecordingLanes::use(Lane lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_.push_back(lane);
  return LaneGuard(static_cast<void*>(this), [this](void*) {
    std::lock_guard<std::mutex> inner(mutex_);
    current_.pop_back();
  });
}

LaneEventPtr RecordingLanes::record(Lane lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::make_shared<RecordedEvent>(order_.record(static_cast<int>(lane)));
}

void RecordingLanes::wait(Lane waiter, const LaneEventPtr& event) {
  const auto* recorded = dynamic_cast<const RecordedEvent*>(event.get());
  TORCH_CHECK(recorded != nullptr, "RecordingLanes: waiting for an event it did not record");
  std::lock_guard<std::mutex> lock(mutex_);
  order_.wait(static_cast<int>(waiter), recorded->id);
}

void RecordingLanes::keep_alive(const at::Tensor& tensor, Lane lane) {
  if (!tensor.defined()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  order_.keep_alive(buffer_of(tensor), static_cast<int>(lane));
}

void RecordingLanes::allocated(const at::Tensor& tensor, Lane lane, const char* name) {
  if (!tensor.defined()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  order_.allocate(buffer_of(tensor), static_cast<int>(lane), name);
}

std::vector<StreamOrder::Buffer> RecordingLanes::buffers(
    const std::vector<at::Tensor>& tensors) const {
  std::vector<StreamOrder::Buffer> out;
  for (const auto& t : tensors) {
    if (t.defined()) out.push_back(buffer_of(t));
  }
  return out;
}

void RecordingLanes::accessed(Lane lane,
                              const char* what,
                              const std::vector<at::Tensor>& reads,
                              const std::vector<at::Tensor>& writes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Lane current = current_.empty() ? Lane::kCompute : current_.back();
  if (current != lane) {
    lane_errors_.push_back(std::string("'") + what + "' is declared on " + lane_name(lane) +
                           " but runs on " + lane_name(current));
  }
  order_.access(static_cast<int>(lane), what, buffers(reads), buffers(writes));
}

void RecordingLanes::freed(const at::Tensor& tensor) {
  if (!tensor.defined()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  order_.free(buffer_of(tensor));
}

std::vector<std::string> RecordingLanes::errors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> all = lane_errors_;
  all.insert(all.end(), order_.errors().begin(), order_.errors().end());
  return all;
}

int64_t RecordingLanes::operations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return order_.operations();
}

}  // namespace shardwise::fsdp
