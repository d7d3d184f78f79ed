// A model written as a list of blocks (its embedding, each layer, its head), cut into pipeline
// stages: cut_by_parameters balances the blocks' parameter counts into contiguous stages
// (split_by_parameters, then stage_groups), and stage_of composes one stage from its blocks,
// their forwards run in order and their parameters together, named as the model names them
// (a tie across stages is found by those names: PipelineOptions::tied).
//
//   auto groups = pipeline::cut_by_parameters(blocks, pp);    // per stage, its block indices
//   auto mine = pipeline::stage_of(blocks, groups[stage], stage);
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/pipeline.h"

namespace shardwise::pipeline {

struct PipelineBlock {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<std::pair<std::string, at::Tensor>> parameters;  // by the model's names
};

// The block indices of each of `stages` contiguous stages, balanced by parameter count. Throws
// std::invalid_argument when there are fewer blocks than stages.
std::vector<std::vector<int>> cut_by_parameters(const std::vector<PipelineBlock>& blocks,
                                                int stages);

// Stage `stage` made of `group`'s blocks.
PipelineStage stage_of(const std::vector<PipelineBlock>& blocks,
                       const std::vector<int>& group,
                       int stage);

}  // namespace shardwise::pipeline
