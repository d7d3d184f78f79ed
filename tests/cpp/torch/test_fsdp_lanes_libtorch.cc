// The FSDP engine's stream protocol, checked on CPU: two thread ranks train through the real
// engine and units with RecordingLanes, which replays every event, wait and record_stream the
// unit issues (what CudaLanes turns into CUDA calls) into the happens-before checker. Catches a
// copy-out not waiting for its all-gather, a reduce-scatter reading gradients before backward's
// event, a buffer that crosses streams dropped without record_stream (the caching allocator
// would reuse it under a running collective), and ops issued on the wrong stream, for forward
// prefetch, both backward prefetch modes, gradient accumulation and the unsharded (DDP-like)
// path whose reduction buffer is the engine's reused scratch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fsdp/fsdp_engine.h"
#include "fsdp/lanes.h"
#include "thread_group.h"

namespace {

using shardwise::fsdp::BackwardPrefetch;
using shardwise::fsdp::Lane;
using shardwise::fsdp::LaneEventPtr;
using shardwise::fsdp::LaneGuard;
using shardwise::fsdp::RecordingLanes;

struct Net : torch::nn::Module {
  Net()
      : a(register_module("a", torch::nn::Linear(8, 24))),
        b(register_module("b", torch::nn::Linear(24, 24))),
        c(register_module("c", torch::nn::Linear(24, 3))) {}
  torch::nn::Linear a, b, c;
};

struct TrainRun {
  BackwardPrefetch prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = true;
  bool shard = true;   // false: no shard group, the replicate group only (DDP-like)
  int accumulate = 1;  // micro-batches per optimizer step (no_sync before the last)
  int steps = 3;
};

// Trains `steps` optimizer steps with the engine on `lanes`; returns the recorded operations.
int64_t train(const TrainRun& run,
              const c10::intrusive_ptr<c10d::ProcessGroup>& group,
              const std::shared_ptr<RecordingLanes>& lanes) {
  torch::manual_seed(0);
  Net net;
  shardwise::fsdp::EngineOptions options;
  options.forward_prefetch = run.forward_prefetch;
  options.backward_prefetch = run.prefetch;
  options.world_group = group;
  options.lanes = lanes;
  auto engine = shardwise::fsdp::FsdpEngine::create(options);
  shardwise::fsdp::UnitOptions unit;
  (run.shard ? unit.shard_group : unit.replicate_group) = group;
  unit.name = "a";
  const int a = engine->add_unit(net.a->parameters(), unit);
  unit.name = "b";
  const int b = engine->add_unit(net.b->parameters(), unit);
  unit.name = "root";
  const int root = engine->add_unit(net.c->parameters(), unit);
  engine->set_root(root);
  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < run.steps; ++step) {
    for (int micro = 0; micro < run.accumulate; ++micro) {
      engine->set_requires_gradient_sync(micro + 1 == run.accumulate);
      const torch::Tensor x = torch::randn({4, 8});
      engine->pre_forward(root);
      engine->pre_forward(a);
      torch::Tensor h = net.a(x);
      engine->post_forward(a, {h});
      engine->pre_forward(b);
      h = net.b(torch::tanh(h));
      engine->post_forward(b, {h});
      const torch::Tensor y = net.c(torch::tanh(h));
      engine->post_forward(root, {y});
      y.square().mean().backward();
    }
    for (int u = 0; u < engine->num_units(); ++u) {  // what the optimizer touches, on compute
      const auto& unit_ref = engine->unit(u);
      lanes->accessed(Lane::kCompute, "optimizer step", unit_ref.grad_shard_views(),
                      unit_ref.shard_views());
    }
    opt.step();
    opt.zero_grad();
  }
  return lanes->operations();
}

std::string first_errors(const std::vector<std::string>& errors) {
  std::string out;
  for (size_t i = 0; i < errors.size() && i < 3; ++i) out += errors[i] + "\n";
  return out;
}

void expect_clean(const TrainRun& run, int64_t min_operations) {
  on_thread_ranks(2, "lanes", [&](int, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    auto lanes = std::make_shared<RecordingLanes>();
    const int64_t operations = train(run, group, lanes);
    EXPECT_TRUE(lanes->errors().empty()) << first_errors(lanes->errors());
    EXPECT_GE(operations, min_operations);
  });
}

// Per step and unit at least: copy-in, all-gather, copy-out, forward (or the unsharded path's
// copy-in and copy-out), backward, reduce copy-in, reduction, reduce copy-out, optimizer.
TEST(FsdpLanesLibTorch, ForwardPrefetchAndBackwardPreAreOrdered) {
  expect_clean(TrainRun{}, 3 * 3 * 8);
}

TEST(FsdpLanesLibTorch, BackwardPostPrefetchAndAccumulationAreOrdered) {
  TrainRun run;
  run.prefetch = BackwardPrefetch::kBackwardPost;
  run.forward_prefetch = false;
  run.accumulate = 2;
  expect_clean(run, 3 * 3 * 8);
}

TEST(FsdpLanesLibTorch, TheUnshardedPathsReusedScratchIsOrdered) {
  TrainRun run;
  run.shard = false;
  expect_clean(run, 3 * 3 * 6);
}

// Lanes that drop one kind of call: the checker must then see the unit's real protocol break.
class Dropping : public RecordingLanes {
 public:
  explicit Dropping(std::string what) : what_(std::move(what)) {}
  void wait(Lane waiter, const LaneEventPtr& event) override {
    if (what_ == "compute waits" && waiter == Lane::kCompute) return;
    RecordingLanes::wait(waiter, event);
  }
  void keep_alive(const at::Tensor& tensor, Lane lane) override {
    if (what_ == "keep alive") return;
    RecordingLanes::keep_alive(tensor, lane);
  }
  LaneGuard use(Lane lane) override {
    if (what_ == "stay on compute") return nullptr;
    return RecordingLanes::use(lane);
  }

 private:
  std::string what_;
};

std::vector<std::string> errors_when_dropping(const std::string& what) {
  std::vector<std::string> found;
  on_thread_ranks(2, "drop", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    auto lanes = std::make_shared<Dropping>(what);
    train(TrainRun{}, group, lanes);
    if (rank == 0) found = lanes->errors();
  });
  return found;
}

bool any_mentions(const std::vector<std::string>& errors, const std::string& words) {
  for (const auto& e : errors) {
    if (e.find(words) != std::string::npos) return true;
  }
  return false;
}

TEST(FsdpLanesLibTorch, CopyOutsThatDoNotWaitAreRaces) {
  const auto errors = errors_when_dropping("compute waits");
  EXPECT_TRUE(any_mentions(errors, "race on 'all-gather output': read by 'all-gather copy-out'"))
      << first_errors(errors);
  EXPECT_TRUE(any_mentions(errors, "read by 'reduce-scatter copy-out' on compute"))
      << first_errors(errors);
}

TEST(FsdpLanesLibTorch, BuffersDroppedWithoutRecordStreamAreEarlyReuses) {
  const auto errors = errors_when_dropping("keep alive");
  EXPECT_TRUE(any_mentions(errors, "early reuse of 'all-gather output'")) << first_errors(errors);
  EXPECT_TRUE(any_mentions(errors, "early reuse of 'full gradient'")) << first_errors(errors);
  EXPECT_TRUE(any_mentions(errors, "early reuse of 'reduce-scatter output'"))
      << first_errors(errors);
}

TEST(FsdpLanesLibTorch, OpsIssuedOnTheWrongStreamAreNamed) {
  const auto errors = errors_when_dropping("stay on compute");
  EXPECT_TRUE(any_mentions(errors, "'all-gather' is declared on all-gather but runs on compute"))
      << first_errors(errors);
}

}  // namespace
