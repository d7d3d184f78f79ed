// The backend's Work handle (csrc/backend/work.cpp) under a profiler: the operation's profiler
// event must end before wait() returns, since a waiter may then drop the work or stop the
// profiler and export its trace.
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "backend/work.hpp"

namespace {

std::atomic<bool> g_event_ended{false};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) { return nullptr; }

// A slow profiler: its end callback takes 100 ms, so a waiter woken before it would see the
// event still open.
void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (std::strncmp(fn.name(), "shardwise:", 10) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    g_event_ended = true;
  }
}

TEST(ShardwiseWorkLibTorch, TheProfilersEventEndsBeforeAWaiterWakes) {
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end));
  auto work = c10::make_intrusive<shardwise::backend::ShardwiseWork>(
      0, c10d::OpType::SEND, 1, std::vector<at::Tensor>{}, std::vector<at::Tensor>{at::ones({2})});
  std::thread worker([&work] { work->finish(nullptr); });
  work->wait();
  EXPECT_TRUE(g_event_ended.load()) << "wait() returned while the profiler's event was open";
  worker.join();
  at::removeCallback(handle);
}

}  // namespace
