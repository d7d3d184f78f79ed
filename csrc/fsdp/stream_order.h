// Happens-before over streams ("lanes"), the way CUDA orders work, torch-free: it checks that the
// FSDP unit's events, waits and record_stream calls make its use of buffers safe, on machines
// without a GPU (fsdp/lanes.h's RecordingLanes feeds it the unit's real calls).
//
// The model. Each lane runs its work in issue order. record(lane) returns an event that completes
// after the lane's work queued so far; wait(lane, event) orders the lane's later work after it;
// host_wait(event) blocks the host until it, so work the host queues afterwards, on any lane,
// comes after it. Vector clocks: `clock_[lane][other]` is how much of `other`'s work is ordered
// before the lane's next op; an op's `stamp` is its position in its own lane.
//
// Checked, each failure one line in errors():
// - race: a buffer read or written on one lane while its last write, or (for a write) a read
//   since, on another lane is not ordered before it;
// - early reuse: the host frees a buffer (the caching allocator may hand its memory to the next
//   allocation on its allocation lane at once) while a use on another lane is neither ordered
//   before the allocation lane's next work, nor known done by the host, nor kept alive for that
//   lane (record_stream: the allocator then waits for that lane's work queued so far);
// - use after free: a freed buffer is touched before it is allocated again.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace shardwise::fsdp {

class StreamOrder {
 public:
  using Buffer = uint64_t;  // identity of an allocation (e.g. a storage's address)

  explicit StreamOrder(std::vector<std::string> lane_names);

  int record(int lane);            // an event after the lane's work so far
  void wait(int lane, int event);  // the lane's later work comes after the event
  void host_wait(int event);       // the host blocks until the event
  void allocate(Buffer buffer, int lane, const std::string& name);
  // One op on `lane` reading `reads` and writing `writes` (allocated buffers).
  void access(int lane,
              const std::string& what,
              const std::vector<Buffer>& reads,
              const std::vector<Buffer>& writes);
  void keep_alive(Buffer buffer, int lane);  // record_stream(buffer, lane)
  void free(Buffer buffer);

  const std::vector<std::string>& errors() const { return errors_; }
  int64_t operations() const { return operations_; }
  int lanes() const { return static_cast<int>(names_.size()); }

 private:
  using Clock = std::vector<uint64_t>;
  struct Use {
    int lane = 0;
    uint64_t stamp = 0;
    std::string what;
  };
  struct State {
    std::string name;
    int lane = 0;  // the allocation lane
    bool live = true;
    std::optional<Use> last_write;
    std::vector<Use> reads;        // since the last write
    std::map<int, Use> last_use;   // per lane
    std::map<int, uint64_t> kept;  // per lane: keep_alive up to this stamp
  };

  void check_lane(int lane) const;
  State* live_state(Buffer buffer, const std::string& what, int lane);
  bool ordered(const Use& use, const Clock& clock) const;
  std::string describe(const Use& use) const;

  std::vector<std::string> names_;
  std::vector<Clock> clock_;  // per lane
  Clock host_;                // work the host knows done
  std::vector<Clock> events_;
  std::map<Buffer, State> buffers_;
  std::vector<std::string> errors_;
  int64_t operations_ = 0;
};

}  // namespace shardwise::fsdp
