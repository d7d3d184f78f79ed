#include "backend/work.hpp"

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include "backend/op_log.hpp"
#include "common/spin_wait.h"

namespace shardwise::backend {

namespace {

// The profiler's record of an operation: its inputs' shapes, only while someone listens
// (otherwise no RecordFunction is made and nothing is copied: every collective passes here).
std::optional<std::vector<at::Tensor>> profiled(const std::vector<at::Tensor>& inputs) {
  if (!at::hasCallbacks() || inputs.empty()) return std::nullopt;
  return inputs;
}

}  // namespace

ShardwiseWork::ShardwiseWork(int rank,
                             c10d::OpType type,
                             uint64_t sequence,
                             std::vector<at::Tensor> outputs,
                             const std::vector<at::Tensor>& inputs,
                             std::chrono::microseconds spin)
    : c10d::Work(
          rank, type, at::hasCallbacks() ? profiling_title(type) : nullptr, profiled(inputs)),
      spin_(spin),
      sequence_(sequence),
      outputs_(std::move(outputs)) {}

bool ShardwiseWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

int ShardwiseWork::sourceRank() const {
  if (!source_) return c10d::Work::sourceRank();  // throws: not a receive from any source
  const int rank = source_->load();
  TORCH_CHECK(rank >= 0, "shardwise backend: sourceRank() of a receive from any source that has ",
              "not completed; wait() for it first");
  return rank;
}

bool ShardwiseWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !error_;
}

std::exception_ptr ShardwiseWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

std::vector<at::Tensor> ShardwiseWork::result() { return outputs_; }

bool ShardwiseWork::wait(std::chrono::milliseconds timeout) {
  spin_until([this] { return completed_.load(std::memory_order_acquire); },
             timeout == kNoTimeout ? spin_ : std::min<std::chrono::microseconds>(spin_, timeout));
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    done_.wait(lock, [this] { return completed_.load(); });
  } else if (!done_.wait_for(lock, timeout, [this] { return completed_.load(); })) {
    TORCH_CHECK(false, "shardwise: rank ", rank_, ": Timed out after ", timeout.count(),
                " ms of wait(): operation #", sequence_, " did not complete");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

// The future is made on first request (most callers only wait()); one made after completion is
// completed at once, one made before is completed by finish().
c10::intrusive_ptr<c10::ivalue::Future> ShardwiseWork::getFuture() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!future_) {
    future_ =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    if (completed_) {
      lock.unlock();
      complete_future(future_);
    }
  }
  return future_;
}

void ShardwiseWork::complete_future(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  if (error_) {
    future->setError(error_);
  } else {
    future->markCompleted(c10::IValue(outputs_));
  }
}

void ShardwiseWork::finish(std::exception_ptr error) {
  // The profiler's event ends with the operation, before anyone can see it complete: a waiter
  // woken first could drop this work, or stop the profiler and export its trace, while the
  // end callback still runs here (a pipeline's asynchronous sends crashed the trace export).
  if (recordFunctionEndCallback_) {
    recordFunctionEndCallback_();
    recordFunctionEndCallback_ = nullptr;
  }
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    future = future_;
    completed_.store(true, std::memory_order_release);
  }
  done_.notify_all();
  if (future) complete_future(future);
}

}  // namespace shardwise::backend
