#include "backend/work.hpp"

#include <c10/util/Exception.h>

namespace shardwise::backend {

ShardwiseWork::ShardwiseWork(int rank,
                             c10d::OpType type,
                             uint64_t sequence,
                             std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      sequence_(sequence),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

bool ShardwiseWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
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
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    done_.wait(lock, [this] { return completed_; });
  } else if (!done_.wait_for(lock, timeout, [this] { return completed_; })) {
    TORCH_CHECK(false, "shardwise: rank ", rank_, ": operation #", sequence_,
                " did not complete within ", timeout.count(), " ms of wait()");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> ShardwiseWork::getFuture() { return future_; }

void ShardwiseWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    error_ = error;
  }
  done_.notify_all();
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

}  // namespace shardwise::backend
