// ZeRO stages 1 and 2 from LibTorch, no Python: two ranks (threads) train a torch::nn model with
// shardwise::zero::ZeroOptimizer over the shardwise backend and end with the parameters of
// single-process torch::optim::AdamW training. Small buckets (several per model) make a wrong
// piece offset, bucket order or divide factor show as a parameter that drifts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "thread_group.h"
#include "zero/zero_optimizer.h"

namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 10;
constexpr int64_t kBatchPerRank = 4;

struct Net : torch::nn::Module {
  Net()
      : first(register_module("first", torch::nn::Linear(8, 17))),
        second(register_module("second", torch::nn::Linear(17, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return second(torch::tanh(first(x))); }
  torch::nn::Linear first;
  torch::nn::Linear second;
};

void train_and_compare(int stage) {
  torch::manual_seed(0);
  Net reference;
  std::vector<Net> ranks(kWorld);
  for (auto& net : ranks) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < net.parameters().size(); ++i) {
      net.parameters()[i].copy_(reference.parameters()[i]);
    }
  }
  const torch::Tensor inputs = torch::randn({kSteps, kWorld * kBatchPerRank, 8});
  const torch::Tensor targets = torch::randn({kSteps, kWorld * kBatchPerRank, 3});
  torch::optim::AdamW reference_opt(reference.parameters(),
                                    torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  for (int step = 0; step < kSteps; ++step) {
    torch::mse_loss(reference.forward(inputs[step]), targets[step]).backward();
    reference_opt.step();
    reference_opt.zero_grad();
  }
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Net& net = ranks[rank];
        shardwise::zero::ZeroOptions options;
        options.stage = stage;
        options.group = make_thread_group(store, rank, kWorld, "zero" + std::to_string(stage));
        options.reduce_bucket_numel = 60;  // several buckets
        options.optimizer.lr = 1e-2;
        options.optimizer.weight_decay = 0.1;
        auto zero = shardwise::zero::ZeroOptimizer::create(net.parameters(), options);
        for (int step = 0; step < kSteps; ++step) {
          auto x = inputs[step].narrow(0, rank * kBatchPerRank, kBatchPerRank);
          auto t = targets[step].narrow(0, rank * kBatchPerRank, kBatchPerRank);
          torch::mse_loss(net.forward(x), t).backward();
          zero->step();
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
    auto got = ranks[rank].parameters();
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[i], expected[i], 1e-5, 1e-6))
          << "stage " << stage << " rank " << rank << " parameter " << i << " differs by "
          << (got[i] - expected[i]).abs().max().item<float>();
    }
  }
}

TEST(ZeroLibTorch, Stage1TwoRanksMatchSingleProcessAdamW) { train_and_compare(1); }
TEST(ZeroLibTorch, Stage2TwoRanksMatchSingleProcessAdamW) { train_and_compare(2); }

}  // namespace
