// The full model's parameters on rank 0 (collective over the mesh), from a model cut into
// pipeline stages (the mesh's pp axis), each stage's parameters tensor-parallel shards (tp) and
// the stages replicated over the data axes (dp, fsdp). Only the first data replica takes part
// (coordinate 0 on dp and on fsdp: an FSDP engine's full state is already whole on each of its
// ranks): each of its stages gathers its shards over tp (`gather_tp`, collective over the tp
// group), and tp rank 0 of every stage sends the whole tensors to stage 0 over the pp group, which
// returns them in the stages' order. Every other rank returns an empty dict.
//
// `stages[s]` lists stage s's parameters by the full model's names with their full shapes and
// dtypes, as every rank knows the cut; `value` is defined on the ranks holding stage s only. There
// may be more stages than pp ranks (virtual stages): stage s lives on pp coordinate s % pp. A tie's
// second copy (a head's copy of the token embedding) is left out of `stages`: the tie is saved
// once. Stage 0 receives into tensors of each parameter's dtype on the device of its own values.
#pragma once

#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "distributed/device_mesh.h"
#include "mesh/mesh_layout.h"

namespace shardwise::training {

struct StagedParameter {
  std::string name;
  std::vector<int64_t> full_shape;
  torch::Tensor value;  // this rank's tensor (a tp shard or whole); undefined on other stages
  at::ScalarType dtype = at::kFloat;  // the whole tensor's, as stage 0 receives it
};

// The whole tensor of parameter `name` from this rank's `value` (collective over tp for a split
// parameter); null: parameters are whole.
using GatherTp = std::function<torch::Tensor(const std::string& name, const torch::Tensor& value)>;

// Where this rank sits: the mesh's layout, its rank there, and its pp group (null: one pp rank).
struct FullStatePlace {
  mesh::MeshLayout layout;
  int rank = 0;
  c10::intrusive_ptr<c10d::ProcessGroup> pp_group;
};

torch::OrderedDict<std::string, torch::Tensor> gather_full_state(
    const FullStatePlace& place,
    const std::vector<std::vector<StagedParameter>>& stages,
    const GatherTp& gather_tp = nullptr);

// The same on a DeviceMesh (its pp group made here when pp > 1: collective over that group).
torch::OrderedDict<std::string, torch::Tensor> gather_full_state(
    distributed::DeviceMesh& mesh,
    const std::vector<std::vector<StagedParameter>>& stages,
    const GatherTp& gather_tp = nullptr);

}  // namespace shardwise::training
