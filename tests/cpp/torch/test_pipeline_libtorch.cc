// The pipeline executor from LibTorch, no Python: two ranks (threads) run a two-stage torch::nn
// model under 1F1B, interleaved 1F1B and ZB-H1 (layers through deferred_linear, so the weight
// gradients really wait for the W actions) over the shardwise backend; the loss and the
// gradients equal those of the unpipelined model on the whole batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "pipeline/deferred_linear.h"
#include "pipeline/executor.h"
#include "thread_group.h"

namespace {

constexpr int kWorld = 2;

void run(shardwise::pipeline::ScheduleKind kind, int virtual_stages, int microbatches) {
  const int stages = kWorld * virtual_stages;
  torch::manual_seed(0);
  std::vector<torch::nn::Linear> layers;
  for (int s = 0; s < stages; ++s) layers.push_back(torch::nn::Linear(6, 6));
  const torch::Tensor x = torch::randn({2 * microbatches, 6});
  const torch::Tensor y = torch::randn({2 * microbatches, 6});
  // Reference: the whole model on the whole batch.
  std::vector<torch::nn::Linear> reference;
  torch::Tensor h = x;
  for (auto& layer : layers) {
    reference.push_back(torch::nn::Linear(6, 6));
    torch::NoGradGuard no_grad;
    reference.back()->weight.copy_(layer->weight);
    reference.back()->bias.copy_(layer->bias);
  }
  for (auto& layer : reference) h = torch::tanh(layer(h));
  const torch::Tensor ref_loss = torch::mse_loss(h, y);
  ref_loss.backward();

  shardwise::pipeline::ScheduleOptions so{kind, kWorld, microbatches, virtual_stages};
  const auto schedule = shardwise::pipeline::make_schedule(so);
  const auto xs = x.chunk(microbatches), ys = y.chunk(microbatches);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> losses(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        shardwise::pipeline::ExecutorOptions options;
        options.schedule = schedule;
        options.rank = rank;
        options.group =
            make_thread_group(store, rank, kWorld, "pipe" + std::to_string(microbatches));
        options.loss = [&](const at::Tensor& out, int i) { return torch::mse_loss(out, ys[i]); };
        std::vector<int> ids;
        std::vector<shardwise::pipeline::PipelineExecutor::StageFn> fns;
        for (int s = rank; s < stages; s += kWorld) {
          ids.push_back(s);
          auto layer = layers[s];
          const bool defer = kind == shardwise::pipeline::ScheduleKind::kZeroBubbleH1;
          fns.push_back([layer, defer](const at::Tensor& in) mutable {
            return torch::tanh(
                defer ? shardwise::pipeline::deferred_linear(in, layer->weight, layer->bias)
                      : layer->forward(in));
          });
        }
        shardwise::pipeline::PipelineExecutor executor(ids, fns, options);
        losses[rank] = executor.step(std::vector<at::Tensor>(xs.begin(), xs.end())).loss;
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) ASSERT_EQ(errors[rank], "") << "rank " << rank;
  EXPECT_NEAR(losses[kWorld - 1], ref_loss.item<double>(), 1e-6 * ref_loss.item<double>());
  for (int s = 0; s < stages; ++s) {
    EXPECT_TRUE(torch::allclose(layers[s]->weight.grad(), reference[s]->weight.grad(), 1e-5, 1e-7))
        << "stage " << s;
    EXPECT_TRUE(torch::allclose(layers[s]->bias.grad(), reference[s]->bias.grad(), 1e-5, 1e-7))
        << "stage " << s;
  }
}

TEST(PipelineLibTorch, OneFOneBMatchesTheUnpipelinedModel) {
  run(shardwise::pipeline::ScheduleKind::k1F1B, 1, 3);
}

TEST(PipelineLibTorch, InterleavedMatchesTheUnpipelinedModel) {
  run(shardwise::pipeline::ScheduleKind::kInterleaved1F1B, 2, 5);
}

TEST(PipelineLibTorch, ZeroBubbleWithDeferredWeightGradientsMatchesTheUnpipelinedModel) {
  run(shardwise::pipeline::ScheduleKind::kZeroBubbleH1, 1, 4);
}

}  // namespace
