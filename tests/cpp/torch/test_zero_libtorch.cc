// ZeRO stages 1 and 2 from LibTorch, no Python: two ranks (threads) train a torch::nn model with
// shardwise::zero::ZeroOptimizer over the shardwise backend and end with the parameters of
// single-process torch::optim::AdamW training. Small buckets (several per model) make a wrong
// piece offset, bucket order or divide factor show as a parameter that drifts.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
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

// overlap_comm: whether a bucket's reduction may still run while backward goes on. The most
// reductions outstanding at once says which ran: 2 with it (the engine's two buffers), 1
// without (each waited for at once); the parameters are the same either way.
void train_and_compare(int stage, bool overlap_comm = true) {
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
        options.overlap_comm = overlap_comm;
        auto zero = shardwise::zero::ZeroOptimizer::create(net.parameters(), options);
        for (int step = 0; step < kSteps; ++step) {
          auto x = inputs[step].narrow(0, rank * kBatchPerRank, kBatchPerRank);
          auto t = targets[step].narrow(0, rank * kBatchPerRank, kBatchPerRank);
          torch::mse_loss(net.forward(x), t).backward();
          zero->step();
        }
        if (zero->max_in_flight() != (overlap_comm ? 2 : 1)) {
          errors[rank] = "overlap_comm " + std::to_string(overlap_comm) + ": " +
                         std::to_string(zero->max_in_flight()) + " reductions in flight";
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
TEST(ZeroLibTorch, Stage2WithoutOverlapCommWaitsForEachReduction) {
  train_and_compare(2, /*overlap_comm=*/false);
}

// ZeRO over the data axis of a tensor-parallel model: 4 thread ranks as a 2 (dp) x 2 (tp) mesh.
// Each tp rank holds its own half `split` of a weight and the same `replicated` bias; both dp
// ranks give the same gradients, so the norm must be the whole model's: the split halves of
// both tp ranks, the bias once. Without the tp options the norm misses the other half; counting
// the bias on both tp ranks (or summing it over tp) gives another number.
void zero_tp_norm(int stage_of_partition) {
  constexpr int kRanks = 4;
  std::vector<double> norms(kRanks);
  auto split_grad = [](int tp) { return torch::full({6}, tp == 0 ? 1.0 : 2.0); };
  const torch::Tensor bias_grad = torch::full({3}, 0.5);
  on_threads_with_store(kRanks, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    const int dp = rank / 2, tp = rank % 2;
    shardwise::zero::ZeroOptions options;
    options.stage = stage_of_partition;
    options.group = make_thread_group(store, dp, 2, "dp" + std::to_string(tp));
    options.tensor_parallel = {make_thread_group(store, tp, 2, "tp" + std::to_string(dp)),
                               {true, false}};
    options.gradient_clipping = 1e9;  // measures the norm, clips nothing
    options.reduce_bucket_numel = 5;  // the split weight and the bias in separate buckets
    std::vector<torch::Tensor> params{torch::zeros({6}).requires_grad_(),
                                      torch::zeros({3}).requires_grad_()};
    auto zero = shardwise::zero::ZeroOptimizer::create(params, options);
    ((params[0] * split_grad(tp)).sum() + (params[1] * bias_grad).sum()).backward();
    zero->step();
    norms[rank] = zero->last_grad_norm();
  });
  const double expected =
      std::sqrt(split_grad(0).pow(2).sum().item<double>() +
                split_grad(1).pow(2).sum().item<double>() + bias_grad.pow(2).sum().item<double>());
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_NEAR(norms[rank], expected, 1e-9 * expected) << "rank " << rank;
  }
}

TEST(ZeroLibTorch, Stage1OverTensorParallelCountsSplitAndReplicatedOnce) { zero_tp_norm(1); }
TEST(ZeroLibTorch, Stage2OverTensorParallelCountsSplitAndReplicatedOnce) { zero_tp_norm(2); }

TEST(ZeroLibTorch, TensorParallelSplitFlagsMustCoverTheParameters) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  shardwise::zero::ZeroOptions options;
  options.tensor_parallel = {make_thread_group(store, 0, 1, "tp"), {true}};
  std::vector<torch::Tensor> params{torch::zeros({4}), torch::zeros({4})};
  try {
    shardwise::zero::ZeroOptimizer::create(params, options);
    FAIL() << "expected an error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor_parallel.split has 1 entries for 2 parameters"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
