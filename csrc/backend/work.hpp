// The Work handle of the shardwise backend: completed by the backend's worker thread, carrying
// a torch.profiler event named "shardwise:<operation>" from issue to completion, and
// either the output tensors (through a c10 Future, so DDP communication hooks and
// torch.futures work) or the exception that names the rank, the operation and the peer.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace shardwise::backend {

class ShardwiseWork : public c10d::Work {
 public:
  // `inputs`: the operation's inputs, whose shapes the profiler event records (as gloo and NCCL
  // record them; none for a barrier). `spin`: how long wait() polls for completion before it
  // blocks.
  ShardwiseWork(int rank,
                c10d::OpType type,
                uint64_t sequence,
                std::vector<at::Tensor> outputs,
                const std::vector<at::Tensor>& inputs,
                std::chrono::microseconds spin = {});

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return sequence_; }
  // A receive from any source: the rank it received from (set by the worker before it
  // finishes). Other operations throw, as c10d::Work does.
  int sourceRank() const override;
  void set_source(std::shared_ptr<std::atomic<int>> source) { source_ = std::move(source); }

  // Called once by the worker thread.
  void finish(std::exception_ptr error);

 private:
  void complete_future(const c10::intrusive_ptr<c10::ivalue::Future>& future);

  mutable std::mutex mutex_;
  std::condition_variable done_;
  std::atomic<bool> completed_{false};  // set under mutex_; wait() first polls it without it
  std::chrono::microseconds spin_;
  std::exception_ptr error_;
  uint64_t sequence_;
  std::shared_ptr<std::atomic<int>> source_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace shardwise::backend
