// The GPT cut into pipeline blocks for shardwise::pipeline::Pipeline, in order: the embedding
// (token + position), each transformer block, and the head (final norm, then a copy of the token
// embedding's weight, tied to it across the stages). pipeline::cut_by_parameters cuts them into
// contiguous stages; stage s runs on the pipeline rank s (a 1F1B or GPipe schedule). Parameter
// names are the model's, so a stage's parameters are found (and exported) by them.
#pragma once

#include <shardwise/shardwise.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

using GPTBlock = shardwise::pipeline::PipelineBlock;  // a forward and its parameters by name

// `model`: the GPT of gpt.h or the TensorParallelGPT of gpt_tensor_parallel.h (their parts:
// embed_tokens, block, head, named); `head_weight`: the last block's own copy of embed.weight.
template <typename Model>
std::vector<GPTBlock> gpt_blocks(std::shared_ptr<Model> model,
                                 int64_t layers,
                                 const torch::Tensor& head_weight) {
  std::vector<GPTBlock> blocks;
  auto embedding = model->named("embed.");
  for (auto& item : model->named("pos.")) embedding.push_back(item);
  blocks.push_back({[model](const torch::Tensor& t) { return model->embed_tokens(t); }, embedding});
  for (int64_t i = 0; i < layers; ++i) {
    blocks.push_back({[model, i](const torch::Tensor& x) { return model->block(i, x); },
                      model->named("blocks." + std::to_string(i) + ".")});
  }
  auto head = model->named("norm.");
  head.push_back({"head.weight", head_weight});
  blocks.push_back(
      {[model, head_weight](const torch::Tensor& x) { return model->head(x, head_weight); }, head});
  return blocks;
}
