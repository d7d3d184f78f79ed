// Resumable checkpoints from LibTorch (checkpoint/training_checkpoint.h, optim/adamw_slots.h):
// a model trained two steps, saved, and loaded into a differently initialised copy takes the
// same third step bit for bit (parameters, AdamW moments and step count all restored); a newer
// torn checkpoint is skipped; ZeRO's pieces round-trip; a missing field is named. tests/package
// checks the files against shardwise-train itself.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>

#include "checkpoint/training_checkpoint.h"
#include "optim/adamw_slots.h"
#include "optim/fused_adamw.h"

namespace {
namespace fs = std::filesystem;
using shardwise::sharding::TensorSlice;

struct Trainee {
  explicit Trainee(uint64_t seed) {
    torch::manual_seed(seed);
    model =
        torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
    optimizer = std::make_shared<shardwise::optim::FusedAdamW>(
        model->parameters(), torch::optim::AdamWOptions(0.1).weight_decay(0.1));
  }
  std::vector<TensorSlice> slots(bool create) {
    std::vector<TensorSlice> params;
    for (const auto& item : model->named_parameters()) {
      params.push_back({item.key(), 0, item.value().detach().view(-1)});
    }
    return shardwise::optim::adamw_slots(params, model->parameters(), *optimizer, create);
  }
  void step(const torch::Tensor& x) {
    optimizer->zero_grad();
    model->forward(x).pow(2).mean().backward();
    optimizer->step();
  }
  torch::nn::Sequential model{nullptr};
  std::shared_ptr<shardwise::optim::FusedAdamW> optimizer;
};

TEST(TrainingCheckpointLibTorch, AResumedCopyTakesTheSameNextStep) {
  const fs::path dir = fs::temp_directory_path() / "shardwise-training-checkpoint-test";
  fs::remove_all(dir);
  const torch::Tensor x = torch::randn({5, 4});
  Trainee original(1);
  original.step(x);
  original.step(x);
  EXPECT_EQ(original.slots(false).size(), 12u);  // 4 parameters, each with 2 moments
  shardwise::checkpoint::TrainingState state;
  state.step = 2;
  state.optimizer_step = shardwise::optim::adamw_step_count(*original.optimizer);
  state.rng = at::detail::getDefaultCPUGenerator().get_state();
  state.data_epoch = 1;
  state.data_index = 7;
  state.pieces = original.slots(false);
  shardwise::checkpoint::SaveOptions options;
  options.directory = dir.string();
  shardwise::checkpoint::save_training_checkpoint(state, options);
  fs::create_directories(dir / "step-00000009");  // torn: no manifest

  auto loaded = shardwise::checkpoint::load_latest_training_checkpoint(dir.string());
  ASSERT_TRUE(loaded.has_value());
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_NE(loaded->skipped[0].find("incomplete checkpoint"), std::string::npos);
  ASSERT_EQ(loaded->ranks.size(), 1u);
  const auto& saved = loaded->ranks[0];
  EXPECT_EQ(saved.step, 2);
  EXPECT_EQ(saved.optimizer_step, 2);
  EXPECT_EQ(saved.data_epoch, 1);
  EXPECT_EQ(saved.data_index, 7);
  EXPECT_TRUE(torch::equal(saved.rng, state.rng));
  shardwise::checkpoint::LoadOptions two;  // several ranks: rank 0's choice, a barrier after
  two.directory = dir.string();
  two.world_size = 2;
  two.broadcast_step = [](int64_t step) { return step; };  // rank 0's side of the broadcast
  EXPECT_THROW(shardwise::checkpoint::load_latest_training_checkpoint(two), c10::ValueError);
  int barriers = 0;
  two.barrier = [&barriers] { ++barriers; };
  const auto agreed = shardwise::checkpoint::load_latest_training_checkpoint(two);
  ASSERT_TRUE(agreed.has_value());
  EXPECT_EQ(agreed->path, loaded->path);
  EXPECT_EQ(barriers, 1);

  Trainee resumed(2);  // other weights, no optimizer state yet
  {
    torch::NoGradGuard no_grad;
    shardwise::sharding::fill_from_pieces(resumed.slots(/*create=*/true), saved.pieces);
  }
  shardwise::optim::set_adamw_step_count(*resumed.optimizer, saved.optimizer_step);
  original.step(x);
  resumed.step(x);
  const auto a = original.model->parameters(), b = resumed.model->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
  fs::remove_all(dir);
}

TEST(TrainingCheckpointLibTorch, ZeroPiecesRoundTripAndAMissingFieldIsNamed) {
  shardwise::checkpoint::TrainingState state;
  state.step = 4;
  shardwise::checkpoint::ZeroCheckpoint zero;
  zero.step = 4;
  zero.micro_steps = 8;
  shardwise::zero::StatePiece piece;
  piece.info = {1, 3, 2, 10};
  piece.tensors["master"] = torch::tensor({1.0f, 2.0f});
  piece.tensors["exp_avg"] = torch::tensor({0.5f, 0.25f});
  zero.pieces.push_back(piece);
  state.zero = zero;
  const auto back = shardwise::checkpoint::from_payload(
      torch::pickle_load(torch::pickle_save(shardwise::checkpoint::to_payload(state))), "file");
  ASSERT_TRUE(back.zero.has_value());
  EXPECT_TRUE(back.pieces.empty());
  EXPECT_EQ(back.zero->step, 4);
  EXPECT_EQ(back.zero->micro_steps, 8);
  ASSERT_EQ(back.zero->pieces.size(), 1u);
  const auto& info = back.zero->pieces[0].info;
  EXPECT_EQ(std::vector<int64_t>({info.param, info.start, info.numel, info.full_numel}),
            std::vector<int64_t>({1, 3, 2, 10}));
  EXPECT_TRUE(torch::equal(back.zero->pieces[0].tensors.at("master"), piece.tensors["master"]));
  EXPECT_TRUE(torch::equal(back.zero->pieces[0].tensors.at("exp_avg"), piece.tensors["exp_avg"]));

  auto payload = shardwise::checkpoint::to_payload(state).toGenericDict();
  (void)payload.erase("data");
  try {
    shardwise::checkpoint::from_payload(payload, "rank-00000.pt");
    FAIL() << "a payload without its data position was accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("rank-00000.pt: no \"data\""), std::string::npos)
        << e.what();
  }
}

// Catches: moment slots taken from the parameter's first elements when the parameter slot views
// later ones (the second run of a tensor-parallel shard), and a copy passed as a slot.
TEST(TrainingCheckpointLibTorch, MomentSlotsViewTheSameElementsAsTheirParameterSlot) {
  Trainee trainee(3);
  trainee.step(torch::randn({5, 4}));
  const torch::Tensor w = trainee.model->parameters()[0];  // 8 x 4
  const torch::Tensor flat = w.detach().view(-1);
  const auto slots = shardwise::optim::adamw_slots(
      {{"w", 100, flat.narrow(0, 20, 12)}, {"w", 0, flat.narrow(0, 0, 20)}}, {w, w},
      *trainee.optimizer, /*create_state=*/false);
  ASSERT_EQ(slots.size(), 6u);
  auto& state = static_cast<torch::optim::AdamWParamState&>(
      *trainee.optimizer->state()[w.unsafeGetTensorImpl()]);
  EXPECT_EQ(slots[1].name, "w:exp_avg");
  EXPECT_EQ(slots[1].start, 100);
  EXPECT_TRUE(torch::equal(slots[1].values, state.exp_avg().view(-1).narrow(0, 20, 12)));
  EXPECT_TRUE(torch::equal(slots[5].values, state.exp_avg_sq().view(-1).narrow(0, 0, 20)));
  try {
    shardwise::optim::adamw_slots({{"w", 0, flat.clone()}}, {w}, *trainee.optimizer, false);
    ADD_FAILURE() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("the slot of 'w' is not a 1-D view"), std::string::npos)
        << e.what();
  }
}

}  // namespace
