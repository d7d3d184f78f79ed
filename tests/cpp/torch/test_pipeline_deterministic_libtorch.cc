// PipelineOptions::deterministic from LibTorch: a model whose first and last layers share W (a
// tied embedding/head) trains one step on a global batch of 8 one-row microbatches, as one stage
// on one rank, as 2 stages, as 2 stages x 2 data replicas, and as 1 stage x 4 replicas (thread
// ranks over the shardwise backend). Every copy's gradient and the clip norm are the same bits
// in all four. Catches autograd's running += over a stage's microbatches, the tied copies summed
// after their own trees instead of per microbatch, the replicas averaged by a ring or divided
// after the sum, a loss divided by the local microbatch count, and a float norm over the stages.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "thread_group.h"

namespace {

namespace pp = shardwise::pipeline;
constexpr int kRows = 8;  // one-row microbatches of the global batch

struct Grads {
  torch::Tensor w_first, w_last, middle_weight, middle_bias;
  double norm = 0;
};

// One step at `stages` x `replicas` ranks; rank = data * stages + stage.
Grads one_step(int stages, int replicas, bool deterministic = true) {
  torch::manual_seed(11);
  const torch::Tensor w = torch::randn({6, 6}) * 0.5;
  torch::nn::Linear initial(6, 6);
  const torch::Tensor x = torch::randn({kRows, 6}), y = torch::randn({kRows, 6});
  Grads out;
  std::mutex mutex;
  const int world = stages * replicas;
  on_threads_with_store(world, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    const int data = rank / stages, stage = rank % stages;
    pp::PipelineOptions o;
    const int microbatches = kRows / replicas;
    o.schedule = pp::make_schedule({pp::ScheduleKind::k1F1B, stages, microbatches, 1});
    o.rank = stage;
    if (stages > 1) o.group = make_thread_group(store, stage, stages, "pp" + std::to_string(data));
    if (replicas > 1)
      o.data_parallel_group =
          make_thread_group(store, data, replicas, "dp" + std::to_string(stage));
    o.loss = [](const at::Tensor& output, const at::Tensor& target) {
      return torch::mse_loss(output, target);
    };
    o.deterministic = deterministic;
    torch::Tensor w_mine = w.clone().requires_grad_(true);
    torch::nn::Linear middle(6, 6);
    {
      torch::NoGradGuard no_grad;
      middle->weight.copy_(initial->weight);
      middle->bias.copy_(initial->bias);
    }
    auto head = [&](const at::Tensor& h) { return torch::linear(torch::tanh(middle(h)), w_mine); };
    auto embed = [&](const at::Tensor& in) { return torch::tanh(torch::linear(in, w_mine)); };
    pp::PipelineStage st;
    st.id = stage;
    if (stages == 1) {
      st.forward = [&](const at::Tensor& in) { return head(embed(in)); };
      st.parameters = {
          {"w", w_mine}, {"middle.weight", middle->weight}, {"middle.bias", middle->bias}};
    } else if (stage == 0) {
      st.forward = embed;
      st.parameters = {{"w", w_mine}};
    } else {
      st.forward = head;
      st.parameters = {
          {"w", w_mine}, {"middle.weight", middle->weight}, {"middle.bias", middle->bias}};
    }
    if (stages > 1) o.tied = {{0, "w", 1, "w"}};
    pp::Pipeline pipe({st}, o);
    const auto rows = kRows / replicas;
    const at::Tensor mine_x = x.narrow(0, data * rows, rows),
                     mine_y = y.narrow(0, data * rows, rows);
    pipe.step(stage == 0 ? mine_x : at::Tensor(), stage == stages - 1 ? mine_y : at::Tensor());
    const double norm = pipe.clip_grad_norm_(1e-3);  // clips: the scaled bits are compared too
    std::lock_guard<std::mutex> lock(mutex);
    if (data != 0) return;
    if (stage == 0) out.w_first = w_mine.grad().clone();
    if (stage == stages - 1) {
      out.w_last = w_mine.grad().clone();
      out.middle_weight = middle->weight.grad().clone();
      out.middle_bias = middle->bias.grad().clone();
      out.norm = norm;
    }
  });
  return out;
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         std::memcmp(a.const_data_ptr(), b.const_data_ptr(), a.nbytes()) == 0;
}

TEST(PipelineDeterministicLibTorch, EveryPipelineAndDataDegreeGivesTheSameBits) {
  const Grads one = one_step(1, 1);
  for (auto [stages, replicas] : {std::pair{2, 1}, {2, 2}, {1, 4}}) {
    const Grads other = one_step(stages, replicas);
    const std::string where = std::to_string(stages) + " stages x " + std::to_string(replicas);
    EXPECT_TRUE(same_bits(other.w_first, one.w_first)) << where;
    EXPECT_TRUE(same_bits(other.w_last, one.w_first)) << where;
    EXPECT_TRUE(same_bits(other.middle_weight, one.middle_weight)) << where;
    EXPECT_TRUE(same_bits(other.middle_bias, one.middle_bias)) << where;
    EXPECT_EQ(other.norm, one.norm) << where;
  }
}

TEST(PipelineDeterministicLibTorch, TheModeMatchesTheDefaultPipelineWithinRounding) {
  // The mode changes only the order of the additions: against the default pipeline's mean
  // gradients (clipped alike), the same values up to float rounding.
  const Grads tree = one_step(2, 2), plain = one_step(2, 2, false);
  EXPECT_TRUE(torch::allclose(tree.w_first, plain.w_first, 1e-5, 1e-7));
  EXPECT_TRUE(torch::allclose(tree.middle_weight, plain.middle_weight, 1e-5, 1e-7));
  EXPECT_NEAR(tree.norm, plain.norm, 1e-6 * plain.norm);
}

TEST(PipelineDeterministicLibTorch, RefusesWhatItsTreeDoesNotCover) {
  pp::PipelineOptions o;
  o.loss = [](const at::Tensor& a, const at::Tensor& b) { return torch::mse_loss(a, b); };
  o.deterministic = true;
  pp::PipelineStage st;
  st.forward = [](const at::Tensor& in) { return in; };
  o.schedule = pp::make_schedule({pp::ScheduleKind::kZeroBubbleH1, 2, 2, 1});
  try {
    pp::Pipeline pipe({st}, o);
    FAIL() << "zb_h1 accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("splits backwards"), std::string::npos) << e.what();
  }
  o.schedule = pp::make_schedule({pp::ScheduleKind::k1F1B, 1, 3, 1});
  o.accumulation = 2;
  try {
    pp::Pipeline pipe({st}, o);
    FAIL() << "3 microbatches with accumulation accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("power of two"), std::string::npos) << e.what();
  }
  o.deterministic = false;  // accumulation is the mode's: refused rather than ignored
  try {
    pp::Pipeline pipe({st}, o);
    FAIL() << "accumulation without the mode accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("deterministic mode only"), std::string::npos) << e.what();
  }
}

}  // namespace
