// The GPT of gpt.h cut into pipeline stages for shardwise::pipeline::Pipeline. The blocks, in
// order: the embedding (token + position), each transformer block, and the head (final norm, then
// a copy of the token embedding's weight, tied to it across the stages).
// pipeline::cut_by_parameters cuts them into contiguous stages; stage s runs on the pipeline rank s
// (a 1F1B or GPipe schedule). Parameter names are the model's, so a stage's parameters are found
// (and exported) by them.
#pragma once

#include <shardwise/shardwise.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "gpt.h"

using GPTBlock = shardwise::pipeline::PipelineBlock;  // a forward and its parameters by name

// `head_weight`: the last block's own copy of embed.weight (the pipeline ties the two).
inline std::vector<GPTBlock> gpt_blocks(GPT model, const torch::Tensor& head_weight) {
  std::vector<GPTBlock> blocks;
  auto named = [&](const std::string& prefix, torch::nn::Module& module) {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : module.named_parameters()) {
      out.push_back({prefix + item.key(), item.value()});
    }
    return out;
  };
  GPTBlock embedding;
  embedding.forward = [model](const torch::Tensor& tokens) mutable {
    auto positions = torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong));
    return model->embed->forward(tokens) + model->pos->forward(positions);
  };
  embedding.parameters = named("embed.", *model->embed);
  for (auto& p : named("pos.", *model->pos)) embedding.parameters.push_back(p);
  blocks.push_back(std::move(embedding));
  for (size_t i = 0; i < model->blocks->size(); ++i) {
    auto block = model->blocks->ptr(i);
    blocks.push_back({[block](const torch::Tensor& x) { return block->as<Block>()->forward(x); },
                      named("blocks." + std::to_string(i) + ".", *block)});
  }
  GPTBlock head;
  head.forward = [model, head_weight](const torch::Tensor& x) mutable {
    return torch::nn::functional::linear(model->norm->forward(x), head_weight);
  };
  head.parameters = named("norm.", *model->norm);
  head.parameters.push_back({"head.weight", head_weight});
  blocks.push_back(std::move(head));
  return blocks;
}
