// The pipeline executor from LibTorch, no Python: two ranks (threads) run a two-stage torch::nn
// model under 1F1B, interleaved 1F1B and ZB-H1 (layers through deferred_linear, so the weight
// gradients really wait for the W actions) over the shardwise backend; the loss and the
// gradients equal those of the unpipelined model on the whole batch. pipeline::Pipeline on a
// 2 (data) x 2 (pipeline) mesh of threads with an embedding/head pair tied across the stages:
// after one step every copy's gradient equals the unsharded model's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "pipeline/block_stages.h"
#include "pipeline/deferred_linear.h"
#include "pipeline/executor.h"
#include "pipeline/pipeline.h"
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

// Stage 0: tanh(x W^T) with W tied; stage 1: tanh(Linear) then the tied W again (as a head). Two
// pipelines (data parallel) each take half of the batch. Catches a tie whose copies drift (no
// initial copy, no gradient sum) and a data-parallel average that is missing or not divided.
TEST(PipelineLibTorch, TiedParametersAndDataParallelAveragingMatchTheUnshardedModel) {
  torch::manual_seed(3);
  const torch::Tensor tied = torch::randn({6, 6}) * 0.4;
  torch::nn::Linear middle(6, 6);
  const torch::Tensor x = torch::randn({8, 6}), y = torch::randn({8, 6});
  // Reference: the whole model on the whole batch, W one parameter used twice.
  torch::Tensor w = tied.clone().requires_grad_(true);
  torch::nn::Linear ref_middle(6, 6);
  {
    torch::NoGradGuard no_grad;
    ref_middle->weight.copy_(middle->weight);
    ref_middle->bias.copy_(middle->bias);
  }
  auto ref_out = torch::linear(torch::tanh(ref_middle(torch::tanh(torch::linear(x, w)))), w);
  torch::mse_loss(ref_out, y).backward();

  std::vector<torch::Tensor> w0_grads(4), w1_grads(4), middle_grads(4);
  std::vector<double> norms(4);
  on_threads_with_store(4, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    const int data = rank / 2, stage = rank % 2;
    auto pipe_group = make_thread_group(store, stage, 2, "pp" + std::to_string(data));
    auto dp_group = make_thread_group(store, data, 2, "dp" + std::to_string(stage));
    shardwise::pipeline::PipelineOptions options;
    options.schedule =
        shardwise::pipeline::make_schedule({shardwise::pipeline::ScheduleKind::k1F1B, 2, 2, 1});
    options.rank = stage;
    options.group = pipe_group;
    options.data_parallel_group = dp_group;
    options.tied = {{0, "w", 1, "w"}};
    options.loss = [](const at::Tensor& out, const at::Tensor& target) {
      return torch::mse_loss(out, target);
    };
    // Stage 1 starts from its own (wrong) values: the pipeline must copy stage 0's.
    torch::Tensor mine = (stage == 0 ? tied.clone() : torch::zeros({6, 6})).requires_grad_(true);
    torch::nn::Linear layer(6, 6);
    {
      torch::NoGradGuard no_grad;
      layer->weight.copy_(middle->weight);
      layer->bias.copy_(middle->bias);
    }
    shardwise::pipeline::PipelineStage s;
    s.id = stage;
    s.parameters = {{"w", mine}};
    if (stage == 0) {
      s.forward = [mine](const at::Tensor& in) { return torch::tanh(torch::linear(in, mine)); };
    } else {
      s.parameters.push_back({"middle.weight", layer->weight});
      s.parameters.push_back({"middle.bias", layer->bias});
      s.forward = [mine, layer](const at::Tensor& in) mutable {
        return torch::linear(torch::tanh(layer(in)), mine);
      };
    }
    shardwise::pipeline::Pipeline pipeline({s}, options);
    if (stage == 1) {
      EXPECT_TRUE(torch::equal(mine.detach(), tied)) << "stage 1 did not start from stage 0's W";
    }
    const auto half = [&](const torch::Tensor& t) { return t.chunk(2)[data]; };
    const auto result = pipeline.step(stage == 0 ? half(x) : torch::Tensor(),
                                      stage == 1 ? half(y) : torch::Tensor());
    norms[rank] = pipeline.clip_grad_norm_(1e9);  // measures only (nothing to clip)
    if (stage == 0) {
      w0_grads[rank] = mine.grad();
    } else {
      w1_grads[rank] = mine.grad();
      middle_grads[rank] = layer->weight.grad();
      EXPECT_GT(result.loss, 0.0);
    }
  });
  // The tied W counted once, as the unpipelined model's one parameter.
  const double ref_norm = std::sqrt(w.grad().pow(2).sum().item<double>() +
                                    ref_middle->weight.grad().pow(2).sum().item<double>() +
                                    ref_middle->bias.grad().pow(2).sum().item<double>());
  for (int rank = 0; rank < 4; ++rank) EXPECT_NEAR(norms[rank], ref_norm, 1e-5 * ref_norm);
  for (int data = 0; data < 2; ++data) {
    EXPECT_TRUE(torch::allclose(w0_grads[2 * data], w.grad(), 1e-5, 1e-7)) << "replica " << data;
    EXPECT_TRUE(torch::equal(w1_grads[2 * data + 1], w0_grads[2 * data])) << "replica " << data;
    EXPECT_TRUE(torch::allclose(middle_grads[2 * data + 1], ref_middle->weight.grad(), 1e-5, 1e-7))
        << "replica " << data;
  }
}

// A model as blocks cut by parameter count: the heavy middle block stands alone, each stage runs
// its blocks in order with their parameters by name, and more stages than blocks is refused.
// Catches a cut that is not contiguous or unbalanced, a stage that drops or reorders a block's
// forward, and a silent empty stage.
TEST(PipelineLibTorch, BlocksAreCutByParametersAndComposedIntoStages) {
  auto block = [](const std::string& name, int64_t numel, double add) {
    shardwise::pipeline::PipelineBlock b;
    b.forward = [add](const torch::Tensor& x) { return x * 2 + add; };
    b.parameters = {{name, torch::zeros({numel})}};
    return b;
  };
  const std::vector<shardwise::pipeline::PipelineBlock> blocks{
      block("a", 10, 1), block("b", 100, 2), block("c", 10, 3), block("d", 10, 4)};
  const auto groups = shardwise::pipeline::cut_by_parameters(blocks, 2);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0], (std::vector<int>{0, 1}));  // 110 | 20: the nearest balance
  EXPECT_EQ(groups[1], (std::vector<int>{2, 3}));
  const auto last = shardwise::pipeline::stage_of(blocks, groups[1], 1);
  EXPECT_EQ(last.id, 1);
  ASSERT_EQ(last.parameters.size(), 2u);
  EXPECT_EQ(last.parameters[0].first, "c");
  EXPECT_EQ(last.parameters[1].first, "d");
  // (x * 2 + 3) * 2 + 4 at x = 1: c then d.
  EXPECT_EQ(last.forward(torch::ones({1})).item<double>(), 14.0);
  EXPECT_THROW(shardwise::pipeline::cut_by_parameters(blocks, 5), std::invalid_argument);
}

}  // namespace
