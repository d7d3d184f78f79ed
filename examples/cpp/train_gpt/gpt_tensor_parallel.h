// The GPT of gpt.h split over a tensor-parallel group (Megatron's layout, from
// shardwise/tensor_parallel): the token embedding and the tied head split on the vocabulary
// (vocab_parallel_embedding; the head a column-parallel linear whose logits stay split, scored
// by vocab_parallel_cross_entropy), attention split by heads (parallel_self_attention), the MLP's
// up projection column-parallel and its down projection row-parallel. Norms, the position
// embedding and the row-parallel biases are replicated; their gradients are equal on every tp
// rank. The shards are cut from the full model, so every tp size starts from the
// same weights. The shards are a tensor_parallel::ShardedParameters of the full model's
// parameters by gpt_split.
#pragma once

#include <shardwise/shardwise.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpt.h"

// How the GPT's parameters are split over the tp group (dim, fused chunks); the rest replicated.
inline shardwise::tensor_parallel::SplitRule gpt_split() {
  using shardwise::tensor_parallel::SplitDim;
  return shardwise::tensor_parallel::split_by_suffix({{"qkv.weight", SplitDim{0, 3}},
                                                      {"qkv.bias", SplitDim{0, 3}},
                                                      {"proj.weight", SplitDim{1}},
                                                      {"down.weight", SplitDim{1}},
                                                      {"embed.weight", SplitDim{0}},
                                                      {"up.weight", SplitDim{0}},
                                                      {"up.bias", SplitDim{0}}});
}

class TensorParallelGPT {
 public:
  TensorParallelGPT(GPT full, c10::intrusive_ptr<c10d::ProcessGroup> tp)
      : cfg_(full->config()), params_(full->named_parameters(), gpt_split(), std::move(tp)) {
    options_.group = params_.group();
    vocab_start_ = params_.group()->getRank() * (cfg_.vocab_size / params_.group()->getSize());
  }

  // Logits [batch, seq, vocab / tp]: this rank's slice of the vocabulary.
  torch::Tensor forward(const torch::Tensor& tokens) const {
    torch::Tensor x = embed_tokens(tokens);
    for (int64_t i = 0; i < cfg_.layers; ++i) x = block(i, x);
    return head(x, p("embed.weight"));
  }

  // The mean cross-entropy of the vocabulary-split logits (never gathered).
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
    shardwise::tensor_parallel::CrossEntropyOptions o;
    o.group = params_.group();
    o.vocab_start = vocab_start_;
    return shardwise::tensor_parallel::vocab_parallel_cross_entropy(logits, targets, o);
  }

  // This rank's parameters (shards and replicas) by the full model's names; full_state() gathers
  // them whole, sharded_slots() gives their checkpoint slots.
  const shardwise::tensor_parallel::ShardedParameters& params() const { return params_; }

  // The parts a pipeline cuts (gpt_pipeline.h), as the full GPT has them: the embeddings, block
  // i, the vocabulary-split head from the final norm and a (tied) embedding shard `weight`, and
  // this rank's parameters whose names start with `prefix`.
  torch::Tensor embed_tokens(const torch::Tensor& tokens) const {
    auto positions = torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong));
    return shardwise::tensor_parallel::vocab_parallel_embedding(tokens, p("embed.weight"),
                                                                vocab_start_, options_) +
           torch::embedding(p("pos.weight"), positions);
  }

  torch::Tensor block(int64_t i, torch::Tensor x) const {
    namespace tp = shardwise::tensor_parallel;
    const std::string b = "blocks." + std::to_string(i) + ".";
    tp::AttentionWeights attention{p(b + "qkv.weight"), p(b + "qkv.bias"), p(b + "proj.weight"),
                                   p(b + "proj.bias")};
    x = x + tp::parallel_self_attention(norm(x, b + "norm1"), attention,
                                        cfg_.heads / params_.group()->getSize(), /*causal=*/true,
                                        options_);
    auto up = tp::column_parallel_linear(norm(x, b + "norm2"), p(b + "up.weight"), p(b + "up.bias"),
                                         options_);
    return x + tp::row_parallel_linear(torch::gelu(up), p(b + "down.weight"), p(b + "down.bias"),
                                       options_);
  }

  torch::Tensor head(const torch::Tensor& x, const torch::Tensor& weight) const {
    return shardwise::tensor_parallel::column_parallel_linear(norm(x, "norm"), weight, std::nullopt,
                                                              options_);
  }

  std::vector<std::pair<std::string, torch::Tensor>> named(const std::string& prefix) const {
    return params_.named(prefix);
  }

 private:
  const torch::Tensor& p(const std::string& name) const { return params_.at(name); }

  torch::Tensor norm(const torch::Tensor& x, const std::string& prefix) const {
    return torch::layer_norm(x, {cfg_.dim}, p(prefix + ".weight"), p(prefix + ".bias"));
  }

  GPTConfig cfg_;
  shardwise::tensor_parallel::ShardedParameters params_;
  shardwise::tensor_parallel::ParallelOptions options_;
  int64_t vocab_start_ = 0;
};
