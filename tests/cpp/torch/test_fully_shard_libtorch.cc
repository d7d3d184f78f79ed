// FullyShardedDataParallel for torch::nn modules: auto-wrapped Sequential children and the root
// unit driven from forward alone (no hand-written engine calls). Two thread ranks train a model
// with a tied embedding/head and match single-process training (losses and parameters); the
// state dicts round-trip across world sizes. Catches: a wrapped child that is not the one the
// model's forward runs (the Sequential replaced in the wrong place), a tied parameter sharded
// twice, pieces with the wrong offsets, and bad state dicts loaded silently.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <vector>

#include "fsdp/fully_shard.h"
#include "thread_group.h"

namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 5;
constexpr int64_t kBatchPerRank = 3;
constexpr int64_t kVocab = 11, kDim = 8, kSeq = 5;

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(kDim, kDim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct TinyLMImpl : torch::nn::Module {
  TinyLMImpl() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    blocks->push_back(Block());
    blocks->push_back(Block());
    blocks->push_back(Block());
    register_module("blocks", blocks);
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
  }
  torch::Tensor forward(torch::Tensor tokens) {
    auto x = blocks->forward(embed(tokens));
    return torch::nn::functional::linear(norm(x), embed->weight);  // tied head
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Sequential blocks;
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(TinyLM);

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape(-1));
}

shardwise::fsdp::FullyShardOptions options_for(c10::intrusive_ptr<c10d::ProcessGroup> group) {
  shardwise::fsdp::FullyShardOptions options;
  options.shard_group = std::move(group);
  return options;
}

torch::OrderedDict<std::string, torch::Tensor> copy_of_parameters(const TinyLM& model) {
  torch::OrderedDict<std::string, torch::Tensor> copy;
  for (const auto& item : model->named_parameters()) {
    copy.insert(item.key(), item.value().detach().clone());
  }
  return copy;
}

// Rank 0's model starts from `initial`, the other ranks' from their own random parameters (so
// only sync_module_states makes them agree).
TinyLM model_on_rank(int rank, torch::OrderedDict<std::string, torch::Tensor>& initial) {
  TinyLM model;
  torch::NoGradGuard no_grad;
  if (rank == 0) {
    for (auto& item : model->named_parameters()) item.value().copy_(initial[item.key()]);
  }
  return model;
}

struct Data {
  torch::Tensor tokens = torch::randint(kVocab, {kSteps, kWorld * kBatchPerRank, kSeq});
  torch::Tensor targets = torch::randint(kVocab, {kSteps, kWorld * kBatchPerRank, kSeq});
};

TEST(FullyShardLibTorch, AutoWrappedModelMatchesSingleProcessTraining) {
  torch::manual_seed(0);
  const Data data;
  TinyLM reference;
  auto initial = copy_of_parameters(reference);
  std::vector<double> reference_losses;
  torch::optim::AdamW reference_opt(reference->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < kSteps; ++step) {
    auto loss = lm_loss(reference->forward(data.tokens[step]), data.targets[step]);
    reference_losses.push_back(loss.item<double>());
    loss.backward();
    reference_opt.step();
    reference_opt.zero_grad();
  }
  std::vector<std::vector<double>> losses(kWorld);
  std::vector<std::vector<shardwise::sharding::TensorSlice>> pieces(kWorld);
  std::mutex mutex;
  on_thread_ranks(kWorld, "fully_shard", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> g) {
    // Rank 0 starts from the reference's parameters, rank 1 from its own random ones:
    // sync_module_states makes rank 0's everyone's.
    TinyLM model = model_on_rank(rank, initial);
    auto* blocks_before = model->blocks.ptr().get();
    shardwise::fsdp::FullyShardedDataParallel<TinyLM> fsdp(model, options_for(g), {&model->blocks});
    ASSERT_NE(model->blocks.ptr().get(), blocks_before);
    ASSERT_EQ(model->named_children()["blocks"].get(), model->blocks.ptr().get());
    ASSERT_EQ(fsdp.engine().num_units(), 4);  // three blocks and the root
    torch::optim::AdamW opt(fsdp.parameters(), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < kSteps; ++step) {
      auto batch = torch::indexing::Slice(rank * kBatchPerRank, (rank + 1) * kBatchPerRank);
      auto loss = lm_loss(fsdp.forward(data.tokens[step].index({batch})),
                          data.targets[step].index({batch}));
      losses[rank].push_back(loss.item<double>());
      loss.backward();
      opt.step();
      opt.zero_grad();
    }
    auto full = fsdp.full_state_dict();
    ASSERT_EQ(full.size(), reference->parameters().size());  // the tied weight once
    for (const auto& item : reference->named_parameters()) {
      ASSERT_NE(full.find(item.key()), nullptr) << item.key();
      EXPECT_TRUE(torch::allclose(full[item.key()], item.value(), 1e-5, 1e-6)) << item.key();
    }
    std::lock_guard<std::mutex> lock(mutex);
    pieces[rank] = fsdp.sharded_state_dict();
  });
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR((losses[0][step] + losses[1][step]) / 2, reference_losses[step], 1e-5) << step;
  }
  // The pieces of two ranks load into one (any world size), and a full state dict back again.
  std::vector<shardwise::sharding::TensorSlice> all = pieces[0];
  all.insert(all.end(), pieces[1].begin(), pieces[1].end());
  on_thread_ranks(1, "fully_shard_reload", [&](int, c10::intrusive_ptr<c10d::ProcessGroup> g) {
    TinyLM model;
    shardwise::fsdp::FullyShardedDataParallel<TinyLM> fsdp(model, options_for(g), {&model->blocks});
    fsdp.load_sharded_state_dict(all);
    auto full = fsdp.full_state_dict();
    for (const auto& item : reference->named_parameters()) {
      EXPECT_TRUE(torch::allclose(full[item.key()], item.value(), 1e-5, 1e-6)) << item.key();
    }
    TinyLM other;
    shardwise::fsdp::FullyShardedDataParallel<TinyLM> copy(other, options_for(g), {&other->blocks});
    copy.load_full_state_dict(full);
    auto x = data.tokens[0];
    EXPECT_TRUE(torch::equal(copy.forward(x), fsdp.forward(x)));
  });
}

TEST(FullyShardLibTorch, BadInputIsNamed) {
  on_thread_ranks(1, "fully_shard_errors", [&](int, c10::intrusive_ptr<c10d::ProcessGroup> g) {
    TinyLM model;
    torch::nn::Sequential stranger;
    stranger->push_back(Block());
    try {
      shardwise::fsdp::FullyShardedDataParallel<TinyLM> fsdp(model, options_for(g), {&stranger});
      FAIL() << "a Sequential outside the model was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a submodule"), std::string::npos) << e.what();
    }
    try {
      shardwise::fsdp::FullyShardedDataParallel<TinyLM> fsdp(TinyLM(), options_for(nullptr));
      FAIL() << "a null shard group was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("shard_group"), std::string::npos) << e.what();
    }
    shardwise::fsdp::FullyShardedDataParallel<TinyLM> fsdp(model, options_for(g), {&model->blocks});
    auto full = fsdp.full_state_dict();
    torch::OrderedDict<std::string, torch::Tensor> missing;
    for (const auto& item : full) {
      if (item.key() != "norm.bias") missing.insert(item.key(), item.value());
    }
    try {
      fsdp.load_full_state_dict(missing);
      FAIL() << "a state dict without norm.bias was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'norm.bias'"), std::string::npos) << e.what();
    }
    full["embed.weight"] = torch::zeros({kVocab + 1, kDim});
    try {
      fsdp.load_full_state_dict(full);
      FAIL() << "a wrongly shaped embed.weight was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'embed.weight' has shape"), std::string::npos);
    }
  });
}

}  // namespace

// The per-module call (FSDP2's, bottom-up): each block sharded by fully_shard before the root
// wrapper, which adopts the blocks' units. Rank 1 starts from other random parameters, so
// sync_module_states must reach the units made before the root (each broadcast before it is
// sharded) and the root's own. Same losses, bit for bit, and the same full state by the same
// names as the auto-wrapped model. Catches a unit not adopted (its forward refused), the
// wrapper's own name component leaking into state dict keys, a parameter sharded twice, and
// the broadcast skipped for units made early.
TEST(FullyShardLibTorch, PerModuleCallsMatchTheAutoWrappedModel) {
  torch::manual_seed(0);
  const Data data;
  auto initial = copy_of_parameters(TinyLM());
  on_thread_ranks(
      kWorld, "fully_shard_per_module", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> g) {
        TinyLM automatic = model_on_rank(rank, initial);
        shardwise::fsdp::FullyShardedDataParallel<TinyLM> a(automatic, options_for(g),
                                                            {&automatic->blocks});
        TinyLM manual = model_on_rank(rank, initial);
        torch::nn::Sequential blocks;
        for (const auto& block : *manual->blocks) {
          blocks->push_back(shardwise::fsdp::fully_shard(block, options_for(g), "block"));
        }
        manual->blocks = manual->replace_module("blocks", blocks);
        try {
          manual->forward(data.tokens[0]);
          FAIL() << "a unit ran before a root adopted it";
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("before any root adopted it"), std::string::npos);
        }
        shardwise::fsdp::FullyShardedDataParallel<TinyLM> b(manual, options_for(g));
        ASSERT_EQ(b.engine().num_units(), 4);  // three blocks and the root
        torch::optim::AdamW opt_a(a.parameters(), torch::optim::AdamWOptions(1e-2));
        torch::optim::AdamW opt_b(b.parameters(), torch::optim::AdamWOptions(1e-2));
        auto batch = torch::indexing::Slice(rank * kBatchPerRank, (rank + 1) * kBatchPerRank);
        for (int step = 0; step < kSteps; ++step) {
          auto tokens = data.tokens[step].index({batch});
          auto targets = data.targets[step].index({batch});
          auto loss_a = lm_loss(a.forward(tokens), targets);
          auto loss_b = lm_loss(b.forward(tokens), targets);
          EXPECT_EQ(loss_a.item<double>(), loss_b.item<double>()) << "step " << step;
          loss_a.backward();
          loss_b.backward();
          opt_a.step();
          opt_b.step();
          opt_a.zero_grad();
          opt_b.zero_grad();
        }
        auto full_a = a.full_state_dict();
        auto full_b = b.full_state_dict();
        ASSERT_EQ(full_a.keys(), full_b.keys());
        for (const auto& item : full_a) {
          EXPECT_TRUE(torch::equal(item.value(), full_b[item.key()])) << item.key();
        }
        try {
          shardwise::fsdp::fully_shard(
              torch::nn::AnyModule(manual->blocks->ptr<shardwise::fsdp::FullyShardedModuleImpl>(0)),
              options_for(g));
          FAIL() << "a sharded block was sharded again";
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("already sharded"), std::string::npos) << e.what();
        }
      });
}

// FSDP2's int reshard_after_forward through FullyShardOptions::post_forward_group: at world 4,
// blocks that keep their share of a group of 2 after forward train bit for bit as blocks that
// reshard fully, hold that share between forward and backward, and all-gather over the group of
// 2 in backward (its sequence advances once per block). Catches the wrong blocks kept, backward
// gathering over the whole shard group again, and a share kept across an optimizer step.
TEST(FullyShardLibTorch, ResharingToAGroupOfTwoAfterForwardTrainsAsResharingFully) {
  constexpr int kWorld4 = 4;
  torch::manual_seed(0);
  const Data data;
  auto initial = copy_of_parameters(TinyLM());
  on_threads_with_store(kWorld4, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    auto world = make_thread_group(store, rank, kWorld4, "world");
    auto pair = make_thread_group(store, rank % 2, 2, "pair" + std::to_string(rank / 2));
    auto make = [&](c10::intrusive_ptr<c10d::ProcessGroup> post_forward) {
      TinyLM model = model_on_rank(rank, initial);
      torch::nn::Sequential blocks;
      auto options = options_for(world);
      options.post_forward_group = std::move(post_forward);
      for (const auto& block : *model->blocks) {
        blocks->push_back(shardwise::fsdp::fully_shard(block, options, "block"));
      }
      model->blocks = model->replace_module("blocks", blocks);
      return std::make_pair(model,
                            std::make_unique<shardwise::fsdp::FullyShardedDataParallel<TinyLM>>(
                                model, options_for(world)));
    };
    auto [plain_model, plain] = make(nullptr);
    auto [paired_model, paired] = make(pair);
    auto unit = [&](int i) {
      return paired_model->blocks->ptr<shardwise::fsdp::FullyShardedModuleImpl>(i)->unit();
    };
    torch::optim::SGD opt_a(plain->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD opt_b(paired->parameters(), torch::optim::SGDOptions(0.1));
    auto batch = torch::indexing::Slice(rank, rank + 1);
    for (int step = 0; step < kSteps; ++step) {
      auto tokens = data.tokens[step].index({batch});
      auto targets = data.targets[step].index({batch});
      auto loss_a = lm_loss(plain->forward(tokens), targets);
      auto loss_b = lm_loss(paired->forward(tokens), targets);
      EXPECT_EQ(loss_a.item<double>(), loss_b.item<double>()) << "step " << step;
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(unit(i)->holds_post_forward_shard()) << i;
      const uint64_t before = pair->getBackend(c10::DeviceType::CPU)->getSequenceNumberForGroup();
      loss_a.backward();
      loss_b.backward();
      EXPECT_EQ(pair->getBackend(c10::DeviceType::CPU)->getSequenceNumberForGroup() - before, 3u)
          << "step " << step;
      for (int i = 0; i < 3; ++i) EXPECT_FALSE(unit(i)->holds_post_forward_shard()) << i;
      opt_a.step();
      opt_b.step();
      opt_a.zero_grad();
      opt_b.zero_grad();
    }
    auto full_a = plain->full_state_dict();
    auto full_b = paired->full_state_dict();
    for (const auto& item : full_a) {
      EXPECT_TRUE(torch::equal(item.value(), full_b[item.key()])) << item.key();
    }
  });
}
