// FullyShardOptions::deterministic from LibTorch: a global batch of 8 micro-batches, rank r of W
// computing micro-batch j * W + r in accumulation step j, each loss divided by 8. At W = 1, 2 and
// 4 (thread ranks) the full gradients after the step and the clip norm are the same bits.
// Catches a reduce-scatter whose association depends on W (the ring), a running sum over the
// accumulation steps, an average's pre/post division, and a norm summed in floating point
// over shards whose boundaries move with W.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "fsdp/fully_shard.h"
#include "thread_group.h"

namespace {

constexpr int kMicroBatches = 8;
constexpr int64_t kDim = 13;

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(kDim, kDim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    for (int i = 0; i < 3; ++i) blocks->push_back(Block());
    register_module("blocks", blocks);
    head = register_module("head", torch::nn::Linear(kDim, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return head(blocks->forward(x)); }
  torch::nn::Sequential blocks;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

struct Step {
  std::vector<torch::Tensor> grads;  // full, in full_state_dict order
  double norm = 0;
};

Step one_step(int world,
              const torch::Tensor& x,
              const torch::Tensor& y,
              const Net& initial,
              bool deterministic = true) {
  Step result;
  std::mutex mutex;
  on_thread_ranks(world, "deterministic" + std::to_string(world),
                  [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
                    Net model;
                    {
                      torch::NoGradGuard no_grad;
                      auto mine = model->parameters();
                      auto theirs = initial->parameters();
                      for (size_t i = 0; i < mine.size(); ++i) mine[i].copy_(theirs[i]);
                    }
                    shardwise::fsdp::FullyShardOptions options;
                    options.shard_group = group;
                    options.deterministic = deterministic;
                    shardwise::fsdp::FullyShardedDataParallel<Net> fsdp(model, options,
                                                                        {&model->blocks});
                    // the default averages: the loss over the local micro-batches
                    const int divisor = deterministic ? kMicroBatches : kMicroBatches / world;
                    for (int j = 0; j < kMicroBatches / world; ++j) {
                      const int m = j * world + rank;
                      auto loss = torch::mse_loss(fsdp.forward(x[m]), y[m]) / divisor;
                      loss.backward();
                    }
                    const double norm = fsdp.engine().clip_grad_norm_(1e30, 2.0);
                    {
                      torch::NoGradGuard no_grad;  // the gradients, gathered as parameters
                      for (auto& p : fsdp.parameters()) p.copy_(p.grad());
                    }
                    auto full = fsdp.full_state_dict();
                    if (rank != 0) return;
                    std::lock_guard<std::mutex> lock(mutex);
                    for (const auto& item : full) result.grads.push_back(item.value().clone());
                    result.norm = norm;
                  });
  return result;
}

TEST(DeterministicLibTorch, EveryWorldSizeGivesTheSameGradientsAndNorm) {
  torch::manual_seed(0);
  // inputs spanning many magnitudes, so every association shows in the bits
  const auto x = torch::randn({kMicroBatches, 4, kDim}) *
                 torch::exp2(torch::randint(-12, 12, {kMicroBatches, 4, kDim}).to(torch::kFloat));
  const auto y = torch::randn({kMicroBatches, 4, 3});
  Net initial;
  const Step reference = one_step(1, x, y, initial);
  ASSERT_FALSE(reference.grads.empty());
  for (int world : {2, 4}) {
    const Step step = one_step(world, x, y, initial);
    ASSERT_EQ(step.grads.size(), reference.grads.size());
    for (size_t i = 0; i < step.grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(step.grads[i], reference.grads[i]))
          << "world " << world << " #" << i;
    }
    EXPECT_EQ(std::memcmp(&step.norm, &reference.norm, sizeof(double)), 0)
        << "world " << world << ": " << step.norm << " vs " << reference.norm;
  }
  // The control: without the mode the same step differs between world 1 and 4 (so the
  // comparison above can fail on these inputs).
  const Step one = one_step(1, x, y, initial, false), four = one_step(4, x, y, initial, false);
  bool all_equal = true;
  for (size_t i = 0; i < one.grads.size(); ++i) {
    all_equal = all_equal && torch::equal(one.grads[i], four.grads[i]);
  }
  EXPECT_FALSE(all_equal);
}

TEST(DeterministicLibTorch, AGroupTheTreeCannotSplitIsRefused) {
  on_thread_ranks(3, "deterministic3", [&](int, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    Net model;
    shardwise::fsdp::FullyShardOptions options;
    options.shard_group = group;
    options.deterministic = true;
    try {
      shardwise::fsdp::FullyShardedDataParallel<Net> fsdp(model, options, {&model->blocks});
      FAIL() << "a group of 3 was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("power-of-two"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
