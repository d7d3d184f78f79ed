// The FSDP engine from LibTorch, no Python: two ranks (threads) train a torch::nn model sharded
// over the shardwise backend and end with the parameters of single-process training. The root
// unit here finishes its backward first, so a backward prefetch of it would fetch parameters
// that the optimizer step then changes: this test caught the engine using such stale data.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "fsdp/fsdp_engine.h"
#include "thread_group.h"

namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 10;
constexpr int64_t kBatchPerRank = 4;

struct Net : torch::nn::Module {
  Net()
      : first(register_module("first", torch::nn::Linear(8, 17))),
        second(register_module("second", torch::nn::Linear(17, 3))) {}
  torch::nn::Linear first;
  torch::nn::Linear second;
};

void copy_params(Net& from, Net& to) {
  torch::NoGradGuard no_grad;
  auto a = from.parameters();
  auto b = to.parameters();
  for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
}

// The forward of `net` through the engine's hooks (root, then first).
torch::Tensor forward(
    shardwise::fsdp::FsdpEngine& engine, Net& net, int first, int root, const torch::Tensor& x) {
  engine.pre_forward(root);
  engine.pre_forward(first);
  auto h = net.first(x);
  engine.post_forward(first, {h});
  auto y = net.second(torch::tanh(h));
  engine.post_forward(root, {y});
  return y;
}

// Two ranks train kSteps; with `evaluate`, a no-grad forward (an eval loss) runs before every
// step and must leave every unit sharded and training unchanged.
void train_two_ranks(bool evaluate) {
  torch::manual_seed(0);
  Net reference;
  std::vector<Net> ranks(kWorld);
  for (auto& net : ranks) copy_params(reference, net);
  const torch::Tensor inputs = torch::randn({kSteps, kWorld * kBatchPerRank, 8});
  const torch::Tensor targets = torch::randn({kSteps, kWorld * kBatchPerRank, 3});

  torch::optim::AdamW reference_opt(reference.parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    auto y = reference.second(torch::tanh(reference.first(inputs[step])));
    torch::mse_loss(y, targets[step]).backward();
    reference_opt.step();
    reference_opt.zero_grad();
  }

  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::vector<torch::Tensor>> finals(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Net& net = ranks[rank];
        auto group = make_thread_group(store, rank, kWorld, "fsdp");
        shardwise::fsdp::EngineOptions engine_options;
        engine_options.world_group = group;
        auto engine = shardwise::fsdp::FsdpEngine::create(engine_options);
        shardwise::fsdp::UnitOptions unit;
        unit.shard_group = group;
        unit.reshard_after_forward = !evaluate;  // evaluation must reshard it anyway
        unit.name = "first";
        const int first = engine->add_unit(net.first->parameters(), unit);
        unit.name = "root";
        const int root = engine->add_unit(net.second->parameters(), unit);
        engine->set_root(root);
        torch::optim::AdamW opt(net.parameters(), torch::optim::AdamWOptions(1e-2));
        for (int step = 0; step < kSteps; ++step) {
          auto x = inputs[step].narrow(0, rank * kBatchPerRank, kBatchPerRank);
          auto t = targets[step].narrow(0, rank * kBatchPerRank, kBatchPerRank);
          if (evaluate) {
            torch::NoGradGuard no_grad;
            forward(*engine, net, first, root, x);
            for (int u : {first, root}) {
              if (engine->unit(u).unsharded()) throw std::runtime_error("unsharded after eval");
            }
          }
          auto y = forward(*engine, net, first, root, x);
          torch::mse_loss(y, t).backward();
          opt.step();
          opt.zero_grad();
        }
        for (int u : {first, root}) {
          for (auto& p : engine->unit(u).full_parameters()) finals[rank].push_back(p);
        }
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(errors[rank], "") << "rank " << rank;
    auto expected = reference.parameters();
    ASSERT_EQ(finals[rank].size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::allclose(finals[rank][i], expected[i], 1e-5, 1e-6))
          << "rank " << rank << " parameter " << i << " differs by "
          << (finals[rank][i] - expected[i]).abs().max().item<float>();
    }
  }
}

TEST(FsdpLibTorch, TwoRanksMatchSingleProcessTraining) { train_two_ranks(false); }

// Catches an eval forward (no-grad: no backward to reshard) leaving the root or a unit without
// reshard_after_forward gathered, which then fed stale full parameters to the next step.
TEST(FsdpLibTorch, NoGradForwardsReshardAndLeaveTrainingUnchanged) { train_two_ranks(true); }

}  // namespace

// One backward on two ranks in bf16 (reduced in bf16), with and without keep_low_precision_grads:
// the gradients of every parameter, by rank and setting.
std::vector<std::vector<torch::Tensor>> bf16_gradients(bool keep_low_precision_grads) {
  torch::manual_seed(0);
  Net reference;
  const torch::Tensor x = torch::randn({kWorld * kBatchPerRank, 8}).to(at::kBFloat16);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::vector<torch::Tensor>> grads(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  std::vector<Net> ranks(kWorld);
  for (auto& net : ranks) copy_params(reference, net);
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Net& net = ranks[rank];
        auto group = make_thread_group(store, rank, kWorld, "fsdp-low");
        auto engine = shardwise::fsdp::FsdpEngine::create({});
        shardwise::fsdp::UnitOptions unit;
        unit.shard_group = group;
        unit.param_dtype = unit.reduce_dtype = at::kBFloat16;
        unit.keep_low_precision_grads = keep_low_precision_grads;
        const int first = engine->add_unit(net.first->parameters(), unit);
        const int root = engine->add_unit(net.second->parameters(), unit);
        engine->set_root(root);
        auto y =
            forward(*engine, net, first, root, x.narrow(0, rank * kBatchPerRank, kBatchPerRank));
        y.to(at::kFloat).pow(2).sum().backward();
        for (auto& p : net.parameters()) grads[rank].push_back(p.grad().clone());
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
  return grads;
}

// Catches keep_low_precision_grads ignored (fp32 gradient shards) or its gradients rounded
// differently from the fp32 shards' values (both hold the bf16 reduction's result).
TEST(FsdpLibTorch, KeepLowPrecisionGradsGivesParamDtypeGradientsOfTheSameValues) {
  const auto full = bf16_gradients(false);
  const auto low = bf16_gradients(true);
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(full[rank].size(), low[rank].size());
    for (size_t i = 0; i < low[rank].size(); ++i) {
      EXPECT_EQ(full[rank][i].scalar_type(), at::kFloat) << "parameter " << i;
      EXPECT_EQ(low[rank][i].scalar_type(), at::kBFloat16) << "parameter " << i;
      EXPECT_TRUE(torch::equal(low[rank][i], full[rank][i].to(at::kBFloat16)))
          << "rank " << rank << " parameter " << i;
    }
  }
}
