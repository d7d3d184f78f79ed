// What a training loop's strategy adds to a resumable checkpoint (checkpoint/
// training_checkpoint.h, shardwise-train's format) and takes back from one. Each rank writes what
// it holds of the parameters and their AdamW moments as pieces of the full tensors (FSDP shards, a
// pipeline stage's parameters, tensor-parallel shards; ZeRO: the ZeRO optimizer's own pieces);
// loading fills this rank's part from the pieces of every saved rank, so a run resumes at any
// strategy and world size (ZeRO only from ZeRO). Which of several ranks holding a tensor writes it
// is checkpoint_writer.h's rule.
//
//   auto hooks = training::adamw_checkpoint(slots, optimizer);   // or zero_checkpoint(zero)
//   training::save_training_step(step, hooks, stream, world, save_options);
//   int64_t done = training::resume_training(directory, hooks, stream, world);
#pragma once

#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/training_checkpoint.h"
#include "mesh/mesh_layout.h"
#include "sharding/checkpoint_pieces.h"
#include "tensor_parallel/shard_tensor.h"
#include "tensor_parallel/sharded_parameters.h"
#include "zero/zero_redundancy_optimizer.h"

namespace shardwise::training {

struct CheckpointHooks {
  std::function<void(checkpoint::TrainingState&)> save;
  // Every saved rank's state (any world size); `path` names the checkpoint in errors.
  std::function<void(const std::vector<checkpoint::TrainingState>&, const std::string& path)> load;
};

// A parameter this rank holds: `value` is the whole tensor `name` of the full model or, with
// `split`, its tensor-parallel shard of the `full_shape` tensor.
struct ParameterSource {
  std::string name;
  torch::Tensor value;
  std::optional<tensor_parallel::ShardSpec> split;
  std::vector<int64_t> full_shape;
};

// The sources this rank writes (checkpoint_writer.h's rule on `layout`): a source is tp-split when
// it has `split`, and tied when its name is in `tied` (held by two pipeline stages).
std::vector<ParameterSource> written_sources(std::vector<ParameterSource> sources,
                                             const mesh::MeshLayout& layout,
                                             int rank,
                                             const std::vector<std::string>& tied = {});

// Checkpoint slots (1-D views placed in the full tensors), each with the parameter it views.
using Slots = std::pair<std::vector<sharding::TensorSlice>, std::vector<torch::Tensor>>;

// The slots of `sources`: a shard's runs in the full tensor (tensor_parallel::shard_slices), a
// whole tensor as one slot.
Slots source_slots(const std::vector<ParameterSource>& sources);

// The slots of the parameters this rank holds; with `saving`, only those it writes.
using ParameterSlots = std::function<Slots(bool saving)>;

// The slots of tensor-parallel `params` (every shard and replica, by the full model's names);
// saving, those rank `rank` of `layout` writes (a replicated parameter by the first tp rank).
ParameterSlots sharded_slots(std::shared_ptr<const tensor_parallel::ShardedParameters> params,
                             mesh::MeshLayout layout,
                             int rank);

// The parameter slots and their AdamW moments (FSDP, a pipeline stage, tensor-parallel shards).
CheckpointHooks adamw_checkpoint(ParameterSlots parameter_slots,
                                 std::shared_ptr<torch::optim::AdamW> optimizer);

// ZeRO: the optimizer's own state pieces (master weights and moments); loading also sets the
// model's weights.
CheckpointHooks zero_checkpoint(std::shared_ptr<zero::ZeroRedundancyOptimizer> optimizer);

}  // namespace shardwise::training
