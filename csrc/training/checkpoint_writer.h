// Which rank writes a tensor into a checkpoint when several ranks hold it. A tensor is replicated
// over an axis when every rank along it holds the same values; of those ranks the one at
// coordinate 0 writes (MeshLayout::is_writer). A parameter's placement decides the axes:
//
//   - dp: the data-parallel replicas (DDP, a pipeline's data parallelism, hybrid FSDP's
//     replicate axis) hold equal copies; fsdp shards are distinct, so fsdp is never listed;
//   - tp: a parameter not split over the tensor-parallel group (norms, biases of row-parallel
//     layers, position embeddings) is equal on every tp rank; a split one is this rank's shard;
//   - pp: a tied parameter held by two stages (a GPT's token embedding on the first stage and the
//     head's copy on the last) is written from the first (coordinate 0), the copy left out.
//
// Every strategy of both trainers writes by this rule, so each piece of the full model is written
// exactly once whatever the mesh. Torch-free.
#pragma once

#include <string>
#include <vector>

#include "mesh/mesh_layout.h"

namespace shardwise::training {

struct ParameterPlacement {
  bool tp_split = false;  // this rank holds its tensor-parallel shard of the parameter
  bool tied = false;      // the parameter is tied across pipeline stages
};

// The axes `placement` is replicated over: dp, then tp unless split, then pp when tied.
std::vector<std::string> replicated_axes(const ParameterPlacement& placement);

// Whether `rank` of `layout` writes a parameter placed as `placement`.
bool writes(const mesh::MeshLayout& layout, int rank, const ParameterPlacement& placement);

}  // namespace shardwise::training
