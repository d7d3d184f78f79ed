// The block cut of block_stages.h.
#include "pipeline/block_stages.h"

#include <stdexcept>

#include "pipeline/partition.h"
#include "pipeline/split_by_time.h"

namespace shardwise::pipeline {

std::vector<std::vector<int>> cut_by_parameters(const std::vector<PipelineBlock>& blocks,
                                                int stages) {
  if (stages < 1 || stages > static_cast<int>(blocks.size())) {
    throw std::invalid_argument("pipeline: " + std::to_string(stages) + " stages of " +
                                std::to_string(blocks.size()) +
                                " blocks; use between 1 and as many stages as blocks");
  }
  std::vector<std::vector<at::Tensor>> block_parameters;
  for (const auto& block : blocks) {
    block_parameters.emplace_back();
    for (const auto& named : block.parameters) block_parameters.back().push_back(named.second);
  }
  return stage_groups(split_by_parameters(block_parameters, stages),
                      static_cast<int>(blocks.size()));
}

PipelineStage stage_of(const std::vector<PipelineBlock>& blocks,
                       const std::vector<int>& group,
                       int stage) {
  PipelineStage out;
  out.id = stage;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> forwards;
  for (int i : group) {
    forwards.push_back(blocks.at(i).forward);
    for (const auto& named : blocks.at(i).parameters) out.parameters.push_back(named);
  }
  out.forward = [forwards](const at::Tensor& input) {
    at::Tensor x = input;
    for (const auto& forward : forwards) x = forward(x);
    return x;
  };
  return out;
}

}  // namespace shardwise::pipeline
