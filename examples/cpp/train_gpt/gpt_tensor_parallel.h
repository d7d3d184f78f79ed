// The GPT of gpt.h split over a tensor-parallel group (Megatron's layout, from
// shardwise/tensor_parallel): the token embedding and the tied head split on the vocabulary
// (vocab_parallel_embedding; the head a column-parallel linear whose logits stay split, scored
// by vocab_parallel_cross_entropy), attention split by heads (parallel_self_attention), the MLP's
// up projection column-parallel and its down projection row-parallel. Norms, the position
// embedding and the row-parallel biases are replicated; their gradients are equal on every tp
// rank. The shards are cut from the full model (shard_tensor), so every tp size starts from the
// same weights; full_state() gathers them back (gather_shards) under the full model's names.
#pragma once

#include <shardwise/shardwise.h>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpt.h"
#include "gpt_pipeline.h"

class TensorParallelGPT {
 public:
  TensorParallelGPT(GPT full, c10::intrusive_ptr<c10d::ProcessGroup> tp)
      : cfg_(full->config()), tp_(std::move(tp)) {
    options_.group = tp_;
    vocab_start_ = tp_->getRank() * (cfg_.vocab_size / tp_->getSize());
    for (const auto& item : full->named_parameters()) {
      const auto s = spec(item.key());
      torch::Tensor value = item.value().detach();
      value = s ? shardwise::tensor_parallel::shard_tensor(value, *s) : value.clone();
      params_[item.key()] = value.requires_grad_(true);
      full_shapes_[item.key()] = item.value().sizes().vec();
      order_.push_back(item.key());
    }
  }

  // Logits [batch, seq, vocab / tp]: this rank's slice of the vocabulary.
  torch::Tensor forward(const torch::Tensor& tokens) const {
    torch::Tensor x = embed(tokens);
    for (int64_t i = 0; i < cfg_.layers; ++i) x = block(i, x);
    return head(x, p("embed.weight"));
  }

  // The model as pipeline blocks (gpt_pipeline.h's cut: the embedding, each transformer block,
  // the head), their parameters this rank's shards by the full model's names; `head_weight` is
  // the head's own copy of embed.weight's shard (the pipeline ties the two).
  std::vector<GPTBlock> blocks(const torch::Tensor& head_weight) const {
    auto named = [&](const std::string& prefix) {
      std::vector<std::pair<std::string, torch::Tensor>> out;
      for (const auto& name : order_) {
        if (name.compare(0, prefix.size(), prefix) == 0) out.push_back({name, p(name)});
      }
      return out;
    };
    std::vector<GPTBlock> out;
    auto embedding = named("embed.");
    for (auto& item : named("pos.")) embedding.push_back(item);
    out.push_back({[this](const torch::Tensor& tokens) { return embed(tokens); }, embedding});
    for (int64_t i = 0; i < cfg_.layers; ++i) {
      out.push_back({[this, i](const torch::Tensor& x) { return block(i, x); },
                     named("blocks." + std::to_string(i) + ".")});
    }
    auto norm_and_head = named("norm.");
    norm_and_head.push_back({"head.weight", head_weight});
    out.push_back({[this, head_weight](const torch::Tensor& x) { return head(x, head_weight); },
                   norm_and_head});
    return out;
  }

  // The mean cross-entropy of the vocabulary-split logits (never gathered).
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const {
    shardwise::tensor_parallel::CrossEntropyOptions o;
    o.group = tp_;
    o.vocab_start = vocab_start_;
    return shardwise::tensor_parallel::vocab_parallel_cross_entropy(logits, targets, o);
  }

  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> out;
    for (const auto& name : order_) out.push_back(params_.at(name));
    return out;
  }

  // Gradients of the split parameters, then of the replicated ones (for clipping).
  std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> split_and_replicated_grads()
      const {
    std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> out;
    for (const auto& name : order_) {
      const auto& g = params_.at(name).grad();
      if (g.defined()) (spec(name) ? out.first : out.second).push_back(g);
    }
    return out;
  }

  // What this rank holds of parameter `name` (the head's copy of the tie: embed.weight's).
  shardwise::training::ParameterSource source(const std::string& name,
                                              const torch::Tensor& value) const {
    const std::string full = model_name(name);
    return {full, value, spec(full), full_shapes_.at(full)};
  }

  // Every parameter's source, in the full model's order.
  std::vector<shardwise::training::ParameterSource> sources() const {
    std::vector<shardwise::training::ParameterSource> out;
    for (const auto& name : order_) out.push_back(source(name, p(name)));
    return out;
  }

  // The whole tensor of parameter `name` from this rank's `value` (collective over the tp group
  // for a split one).
  torch::Tensor gather(const std::string& name, const torch::Tensor& value) const {
    const auto s = spec(model_name(name));
    return s ? shardwise::tensor_parallel::gather_shards(value, *s, tp_) : value.detach().clone();
  }

  // Whether parameter `name` is split over the tp group.
  bool split(const std::string& name) const { return spec(model_name(name)).has_value(); }

  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return tp_; }
  const torch::Tensor& parameter(const std::string& name) const { return params_.at(name); }
  // The full model's shape of parameter `name`.
  std::vector<int64_t> full_shape(const std::string& name) const {
    return full_shapes_.at(model_name(name));
  }

  // The full model's parameters by name (collective over the tp group).
  torch::OrderedDict<std::string, torch::Tensor> full_state() const {
    torch::OrderedDict<std::string, torch::Tensor> out;
    for (const auto& name : order_) out.insert(name, gather(name, p(name)));
    return out;
  }

 private:
  // How parameter `name` is split over the tp group (dim, fused chunks); nullopt: replicated.
  std::optional<shardwise::tensor_parallel::ShardSpec> spec(const std::string& name) const {
    auto ends = [&](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    int64_t dim = 0, chunks = 1;
    if (ends("qkv.weight") || ends("qkv.bias")) {
      chunks = 3;
    } else if (ends("proj.weight") || ends("down.weight")) {
      dim = 1;
    } else if (name != "embed.weight" && !ends("up.weight") && !ends("up.bias")) {
      return std::nullopt;
    }
    return shardwise::tensor_parallel::ShardSpec{dim,  chunks,  tp_->getRank(), tp_->getSize(),
                                                 name, "weight"};
  }

  const torch::Tensor& p(const std::string& name) const { return params_.at(name); }

  torch::Tensor embed(const torch::Tensor& tokens) const {
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
                                        cfg_.heads / tp_->getSize(), /*causal=*/true, options_);
    auto up = tp::column_parallel_linear(norm(x, b + "norm2"), p(b + "up.weight"), p(b + "up.bias"),
                                         options_);
    return x + tp::row_parallel_linear(torch::gelu(up), p(b + "down.weight"), p(b + "down.bias"),
                                       options_);
  }

  // Vocabulary-split logits from the final norm and the (tied) embedding shard `weight`.
  torch::Tensor head(const torch::Tensor& x, const torch::Tensor& weight) const {
    return shardwise::tensor_parallel::column_parallel_linear(norm(x, "norm"), weight, std::nullopt,
                                                              options_);
  }

  torch::Tensor norm(const torch::Tensor& x, const std::string& prefix) const {
    return torch::layer_norm(x, {cfg_.dim}, p(prefix + ".weight"), p(prefix + ".bias"));
  }

  GPTConfig cfg_;
  c10::intrusive_ptr<c10d::ProcessGroup> tp_;
  shardwise::tensor_parallel::ParallelOptions options_;
  int64_t vocab_start_ = 0;
  std::map<std::string, torch::Tensor> params_;
  std::map<std::string, std::vector<int64_t>> full_shapes_;
  std::vector<std::string> order_;  // the full model's parameter order
};
