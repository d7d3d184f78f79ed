// The full model's parameters on rank 0 (collective over the mesh), from a model cut into
// pipeline stages (the mesh's pp axis), each stage's parameters tensor-parallel shards (tp) and
// the stages replicated over the data axis (dp). Only the first data replica takes part: each of
// its stages gathers its shards over tp (`gather_tp`, collective over the tp group), and tp
// rank 0 of every stage sends the whole tensors to stage 0 over the pp group, which returns them
// in the stages' order. Every other rank returns an empty dict.
//
// `stages[s]` lists stage s's parameters by the full model's names with their full shapes, as
// every rank knows the cut; `value` is defined on the ranks of stage s only. A tie's second copy
// (a head's copy of the token embedding) is left out of `stages`: the tie is saved once.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "distributed/device_mesh.h"

namespace shardwise::training {

struct StagedParameter {
  std::string name;
  std::vector<int64_t> full_shape;
  torch::Tensor value;  // this rank's tensor (a tp shard or whole); undefined on other stages
};

// The whole tensor of parameter `name` from this rank's `value` (collective over tp for a split
// parameter); null: parameters are whole.
using GatherTp = std::function<torch::Tensor(const std::string& name, const torch::Tensor& value)>;

torch::OrderedDict<std::string, torch::Tensor> gather_full_state(
    distributed::DeviceMesh& mesh,
    const std::vector<std::vector<StagedParameter>>& stages,
    const GatherTp& gather_tp = nullptr);

}  // namespace shardwise::training
