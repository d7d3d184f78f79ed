// Tensor parallelism from LibTorch, no Python: two ranks (threads) over the shardwise backend run
// a column -> row MLP (with and without sequence parallelism), head-split attention, the
// vocabulary-parallel embedding and cross-entropy, each against the unsplit computation on one
// rank: outputs and every gradient (shards compared with the matching slice of the full one).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "tensor_parallel/parallel_attention.h"
#include "tensor_parallel/parallel_linear.h"
#include "tensor_parallel/shard_tensor.h"
#include "tensor_parallel/sharded_parameters.h"
#include "tensor_parallel/vocab_parallel.h"
#include "thread_group.h"

namespace tp = shardwise::tensor_parallel;

namespace {

constexpr int kWorld = 2;

void on_ranks(const std::string& name, const std::function<void(int, tp::Group)>& fn) {
  on_thread_ranks(kWorld, name, fn);
}

torch::Tensor shard(const torch::Tensor& full, int64_t dim, int rank, int64_t chunks = 1) {
  return tp::shard_tensor(full, tp::ShardSpec{dim, chunks, rank, kWorld, "test", "w"});
}

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kDouble) - b.to(torch::kDouble)).norm() /
          b.to(torch::kDouble).norm().clamp_min(1e-30))
      .item<double>();
}

struct Mlp {  // the unsplit reference: x -> gelu(x W1^T + b1) W2^T + b2
  torch::Tensor w1, b1, w2, b2, x;
};

Mlp make_mlp() {
  torch::manual_seed(0);
  return {torch::randn({32, 8}), torch::randn({32}), torch::randn({8, 32}) * 0.2, torch::randn({8}),
          torch::randn({2, 6, 8})};
}

void mlp_matches_unsplit(bool sequence_parallel) {
  const Mlp m = make_mlp();
  std::vector<torch::Tensor> ref;  // out, dx, dw1, db1, dw2, db2
  {
    auto w1 = m.w1.clone().requires_grad_(), b1 = m.b1.clone().requires_grad_();
    auto w2 = m.w2.clone().requires_grad_(), b2 = m.b2.clone().requires_grad_();
    auto x = m.x.clone().requires_grad_();
    auto out = torch::linear(torch::gelu(torch::linear(x, w1, b1)), w2, b2);
    (out * out).sum().backward();
    ref = {out.detach(), x.grad(), w1.grad(), b1.grad(), w2.grad(), b2.grad()};
  }
  on_ranks(sequence_parallel ? "mlp_sp" : "mlp", [&](int rank, tp::Group group) {
    tp::ParallelOptions options{group, sequence_parallel, 1};
    auto w1 = shard(m.w1, 0, rank).requires_grad_(), b1 = shard(m.b1, 0, rank).requires_grad_();
    auto w2 = shard(m.w2, 1, rank).requires_grad_(), b2 = m.b2.clone().requires_grad_();
    auto x_full = m.x.clone();
    auto x = (sequence_parallel ? shard(x_full, 1, rank) : x_full).requires_grad_();
    auto out = tp::row_parallel_linear(torch::gelu(tp::column_parallel_linear(x, w1, b1, options)),
                                       w2, b2, options);
    const auto out_ref = sequence_parallel ? shard(ref[0], 1, rank) : ref[0];
    EXPECT_LT(rel(out, out_ref), 1e-6);
    (out * out).sum().backward();
    const auto dx_ref = sequence_parallel ? shard(ref[1], 1, rank) : ref[1];
    EXPECT_LT(rel(x.grad(), dx_ref), 1e-6) << "input gradient, rank " << rank;
    EXPECT_LT(rel(w1.grad(), shard(ref[2], 0, rank)), 1e-6) << "column weight, rank " << rank;
    EXPECT_LT(rel(b1.grad(), shard(ref[3], 0, rank)), 1e-6) << "column bias, rank " << rank;
    EXPECT_LT(rel(w2.grad(), shard(ref[4], 1, rank)), 1e-6) << "row weight, rank " << rank;
    EXPECT_LT(rel(b2.grad(), ref[5]), 1e-6) << "row bias (replicated), rank " << rank;
  });
}

TEST(TensorParallelLibTorch, ColumnThenRowMlpMatchesUnsplit) { mlp_matches_unsplit(false); }

TEST(TensorParallelLibTorch, SequenceParallelMlpMatchesUnsplit) { mlp_matches_unsplit(true); }

TEST(TensorParallelLibTorch, HeadSplitAttentionMatchesUnsplit) {
  torch::manual_seed(1);
  const int64_t heads = 4, dim = 16;
  const auto wqkv = torch::randn({3 * dim, dim}) * 0.3, bqkv = torch::randn({3 * dim});
  const auto wo = torch::randn({dim, dim}) * 0.3, bo = torch::randn({dim});
  const auto x = torch::randn({2, 5, dim});
  auto full_w = wqkv.clone().requires_grad_();
  auto qkv = torch::linear(x, full_w, bqkv).view({2, 5, 3, heads, dim / heads}).unbind(2);
  auto attn = torch::scaled_dot_product_attention(qkv[0].transpose(1, 2), qkv[1].transpose(1, 2),
                                                  qkv[2].transpose(1, 2), {}, 0.0, true);
  auto ref = torch::linear(attn.transpose(1, 2).reshape({2, 5, dim}), wo, bo);
  ref.sum().backward();
  on_ranks("attention", [&](int rank, tp::Group group) {
    auto w = shard(wqkv, 0, rank, 3).requires_grad_();
    tp::AttentionWeights weights{w, shard(bqkv, 0, rank, 3), shard(wo, 1, rank), bo};
    auto out = tp::parallel_self_attention(x, weights, heads / kWorld, true, {group, false, 1});
    EXPECT_LT(rel(out, ref), 1e-6);
    out.sum().backward();
    EXPECT_LT(rel(w.grad(), shard(full_w.grad(), 0, rank, 3)), 1e-6) << "rank " << rank;
  });
}

TEST(TensorParallelLibTorch, VocabParallelEmbeddingAndCrossEntropyMatchUnsplit) {
  torch::manual_seed(2);
  const int64_t vocab = 10;
  const auto table = torch::randn({vocab, 4});
  const auto ids = torch::randint(0, vocab, {3, 5});
  auto targets = torch::randint(0, vocab, {3, 5});
  targets.index_put_({0, 1}, -100);  // ignored tokens leave the mean
  targets.index_put_({2, 4}, -100);
  auto full = table.clone().requires_grad_();
  auto emb = torch::embedding(full, ids);
  auto logits_full = torch::matmul(emb, full.t());  // tied head
  auto ref =
      torch::nn::functional::cross_entropy(logits_full.reshape({-1, vocab}), targets.reshape({-1}));
  ref.backward();
  on_ranks("vocab", [&](int rank, tp::Group group) {
    auto w = shard(table, 0, rank).requires_grad_();
    const int64_t start = rank * vocab / kWorld;
    auto e = tp::vocab_parallel_embedding(ids, w, start, {group, false, 1});
    EXPECT_LT(rel(e, emb), 1e-6);
    auto logits = tp::column_parallel_linear(e, w, std::nullopt, {group, false, 1});
    tp::CrossEntropyOptions ce;
    ce.group = group;
    ce.vocab_start = start;
    auto loss = tp::vocab_parallel_cross_entropy(logits, targets, ce);
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-6 * ref.item<double>());
    loss.backward();
    EXPECT_LT(rel(w.grad(), shard(full.grad(), 0, rank)), 1e-6) << "rank " << rank;
  });
}

TEST(TensorParallelLibTorch, GatherShardsUndoesShardTensorForFusedParts) {
  const torch::Tensor full = torch::randn({6, 4});  // a [q; k; v] of 2 rows each
  on_ranks("gather", [&](int rank, tp::Group group) {
    const tp::ShardSpec spec{0, 3, rank, kWorld, "attn", "qkv"};
    EXPECT_TRUE(torch::equal(tp::gather_shards(tp::shard_tensor(full, spec), spec, group), full));
    const tp::ShardSpec columns{1, 1, rank, kWorld, "mlp", "down"};
    EXPECT_TRUE(
        torch::equal(tp::gather_shards(tp::shard_tensor(full, columns), columns, group), full));
  });
}

// Catches: checkpoint slots of a tp shard placed at the wrong offsets of the full tensor (fused
// QKV parts, a column split's strided runs), so pieces saved at one tp size refill another.
TEST(TensorParallelLibTorch, ShardSlicesRefillTheFullTensorAndOtherTpSizes) {
  const torch::Tensor full = torch::randn({6, 4});
  for (const auto& [dim, chunks] : {std::pair<int64_t, int64_t>{0, 3}, {1, 1}}) {
    std::vector<shardwise::sharding::TensorSlice> pieces;
    for (int rank = 0; rank < 2; ++rank) {
      const tp::ShardSpec spec{dim, chunks, rank, 2, "attn", "w"};
      for (auto& slice : tp::shard_slices("w", tp::shard_tensor(full, spec), {6, 4}, spec)) {
        pieces.push_back({slice.name, slice.start, slice.values.clone()});
      }
    }
    torch::Tensor whole = torch::zeros({6, 4});
    shardwise::sharding::fill_from_pieces({{"w", 0, whole.view(-1)}}, pieces);
    EXPECT_TRUE(torch::equal(whole, full)) << "dim " << dim;
    const int64_t size = dim == 0 ? 1 : 4;  // 6 rows / 3 parts: tp 1 or 2; 4 columns: tp 4
    for (int rank = 0; rank < size; ++rank) {
      const tp::ShardSpec spec{dim, chunks, rank, static_cast<int>(size), "attn", "w"};
      torch::Tensor mine = torch::zeros_like(tp::shard_tensor(full, spec));
      shardwise::sharding::fill_from_pieces(tp::shard_slices("w", mine, {6, 4}, spec), pieces);
      EXPECT_TRUE(torch::equal(mine, tp::shard_tensor(full, spec))) << dim << " " << rank;
    }
  }
  try {
    tp::shard_slices("w", torch::zeros({4, 4}), {6, 4}, tp::ShardSpec{1, 1, 0, 2, "attn", "w"});
    ADD_FAILURE() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'w' has 16 elements"), std::string::npos) << e.what();
  }
}

TEST(TensorParallelLibTorch, BadArgumentsAreNamed) {
  on_ranks("bad", [&](int rank, tp::Group group) {
    (void)rank;
    try {
      tp::column_parallel_linear(torch::randn({2, 3}), torch::randn({4, 5}), std::nullopt,
                                 {group, false, 1});
      ADD_FAILURE() << "no error";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("in_features"), std::string::npos) << e.what();
    }
    try {
      tp::shard_tensor(torch::randn({6, 4}), tp::ShardSpec{0, 1, 0, 4, "blocks.0.up", "weight"});
      ADD_FAILURE() << "no error";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("blocks.0.up"), std::string::npos) << e.what();
    }
  });
}

// Catches a suffix rule that matches inside a word ("setup.weight" split as "up.weight") or
// lets a later entry win over an earlier one.
TEST(TensorParallelLibTorch, SplitBySuffixMatchesWholeNamesOrAfterADot) {
  const auto rule =
      tp::split_by_suffix({{"qkv.weight", {0, 3}}, {"up.weight", {0}}, {"weight", {1}}});
  EXPECT_EQ(rule("blocks.0.qkv.weight")->chunks, 3);
  EXPECT_EQ(rule("up.weight")->dim, 0);
  EXPECT_EQ(rule("blocks.0.setup.weight")->dim, 1) << "not up.weight: no dot before 'up'";
  EXPECT_EQ(rule("weight")->dim, 1);
  EXPECT_FALSE(rule("blocks.0.up.bias").has_value());
  EXPECT_FALSE(rule("blocks.0.upweight").has_value());
}

// Catches a prefix filter that reorders or leaks other modules' parameters, and a full state
// that loses a shard.
TEST(TensorParallelLibTorch, ShardedParametersGiveAModulesPartAndTheWholeState) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(4, 6), torch::nn::Linear(6, 4));
  const auto full = model->named_parameters();
  on_thread_ranks(2, "sharded-params", [&](int, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    const tp::ShardedParameters params(
        full, tp::split_by_suffix({{"0.weight", {0}}, {"0.bias", {0}}, {"1.weight", {1}}}), group);
    const auto first = params.named("0.");
    ASSERT_EQ(first.size(), 2u);
    EXPECT_EQ(first[0].first, "0.weight");
    EXPECT_EQ(first[1].first, "0.bias");
    EXPECT_EQ(first[0].second.size(0), 3) << "this rank's half of 6 rows";
    const auto whole = params.full_state();
    ASSERT_EQ(whole.size(), full.size());
    for (const auto& item : full) {
      EXPECT_TRUE(torch::equal(whole[item.key()], item.value().detach())) << item.key();
    }
  });
}

}  // namespace
