// The bundled GPT of shardwise-train (python/shardwise/models/gpt.py) in torch::nn: token and
// position embeddings, pre-norm blocks in a Sequential (`blocks`, which FSDP auto-wraps), a final
// norm and a head tied to the token embedding. Parameter names match the Python model's.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t seq_len = 128;
  int64_t dim = 192;
  int64_t layers = 4;
  int64_t heads = 6;
  int64_t mlp_ratio = 4;
};

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& cfg)
      : heads_(cfg.heads),
        head_dim_(cfg.dim / cfg.heads),
        norm1(
            register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})))),
        qkv(register_module("qkv", torch::nn::Linear(cfg.dim, 3 * cfg.dim))),
        proj(register_module("proj", torch::nn::Linear(cfg.dim, cfg.dim))),
        norm2(
            register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})))),
        up(register_module("up", torch::nn::Linear(cfg.dim, cfg.mlp_ratio * cfg.dim))),
        down(register_module("down", torch::nn::Linear(cfg.mlp_ratio * cfg.dim, cfg.dim))) {}

  torch::Tensor forward(torch::Tensor x) {
    auto qkv_out = qkv(norm1(x));
    const int64_t b = qkv_out.size(0), t = qkv_out.size(1);
    auto parts = qkv_out.view({b, t, 3, -1, head_dim_}).unbind(2);
    auto attn = at::scaled_dot_product_attention(parts[0].transpose(1, 2), parts[1].transpose(1, 2),
                                                 parts[2].transpose(1, 2), {}, 0.0,
                                                 /*is_causal=*/true);
    x = x + proj(attn.transpose(1, 2).reshape({b, t, -1}));
    return x + down(torch::gelu(up(norm2(x))));
  }

 private:
  int64_t heads_, head_dim_;
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& cfg) : cfg_(cfg) {
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab_size, cfg.dim));
    pos = register_module("pos", torch::nn::Embedding(cfg.seq_len, cfg.dim));
    for (int64_t i = 0; i < cfg.layers; ++i) blocks->push_back(Block(cfg));
    register_module("blocks", blocks);
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    torch::NoGradGuard no_grad;
    for (auto& module : modules(/*include_self=*/false)) {
      if (auto* linear = module->as<torch::nn::Linear>()) {
        torch::nn::init::normal_(linear->weight, 0.0, 0.02);
        if (linear->bias.defined()) torch::nn::init::zeros_(linear->bias);
      } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
        torch::nn::init::normal_(embedding->weight, 0.0, 0.02);
      }
    }
  }

  // Logits [batch, seq, vocab]; the head is the token embedding (tied).
  torch::Tensor forward(torch::Tensor tokens) {
    return head(blocks->forward(embed_tokens(tokens)), embed->weight);
  }

  // The parts a pipeline cuts (gpt_pipeline.h), as TensorParallelGPT has them: the token and
  // position embeddings, block i, the final norm and a head `weight`, and the parameters whose
  // names start with `prefix`.
  torch::Tensor embed_tokens(const torch::Tensor& tokens) {
    return embed(tokens) + pos(torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong)));
  }
  torch::Tensor block(int64_t i, const torch::Tensor& x) {
    return blocks[i]->as<Block>()->forward(x);
  }
  torch::Tensor head(const torch::Tensor& x, const torch::Tensor& weight) {
    return torch::nn::functional::linear(norm(x), weight);
  }
  std::vector<std::pair<std::string, torch::Tensor>> named(const std::string& prefix) {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : named_parameters()) {
      if (item.key().rfind(prefix, 0) == 0) out.emplace_back(item.key(), item.value());
    }
    return out;
  }

  const GPTConfig& config() const { return cfg_; }
  torch::nn::Embedding embed{nullptr}, pos{nullptr};
  torch::nn::Sequential blocks;
  torch::nn::LayerNorm norm{nullptr};

 private:
  GPTConfig cfg_;
};
TORCH_MODULE(GPT);
