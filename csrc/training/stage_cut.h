// A model's blocks cut into pipeline stages, as every rank knows the cut, and this rank's stage:
// what the training rules need from the cut. Parameters are named by the full model's names,
// except a tie's copy (`Tie::copy`: a GPT head's "head.weight", the last stage's own copy of the
// token embedding "embed.weight", `Tie::name`), which stands for the tie: the clip scales it
// without counting it (mesh_clip.h), and the full state and the checkpoint take the tie from the
// first stage only (full_state.h, checkpoint_writer.h). With tensor parallelism `sharded` holds
// the blocks' tp shards (their split rule, full shapes and gather); null: parameters are whole.
//
//   training::StageCut cut(blocks, pipeline::cut_by_parameters(blocks, pp), stage, tie, sharded);
//   pipeline::Pipeline pipeline({cut.mine()}, options);
//   ... pipeline.step(inputs, targets); cut.clip_grad_norm(max_norm, options.group);
//   auto slots = cut.slots(mesh);                  // adamw_checkpoint(slots, optimizer)
//   auto full = cut.full_state(*mesh);             // rank 0 (collective)
#pragma once

#include <torch/ordered_dict.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

#include "distributed/device_mesh.h"
#include "pipeline/block_stages.h"
#include "tensor_parallel/sharded_parameters.h"
#include "training/checkpoint_hooks.h"
#include "training/full_state.h"
#include "training/mesh_clip.h"

namespace shardwise::training {

struct Tie {
  std::string name;  // the tie's name on the first stage (the one saved)
  std::string copy;  // its copy's name on the last stage; empty: no tie
};

class StageCut {
 public:
  // `groups[s]`: stage s's block indices (pipeline::cut_by_parameters); this rank runs `stage`.
  StageCut(std::vector<pipeline::PipelineBlock> blocks,
           std::vector<std::vector<int>> groups,
           int stage,
           Tie tie = {},
           std::shared_ptr<const tensor_parallel::ShardedParameters> sharded = nullptr);

  const pipeline::PipelineStage& mine() const { return mine_; }
  int stage() const { return stage_; }
  // The full model's name of a block parameter (the tie's copy: the tie's name).
  std::string model_name(const std::string& name) const;
  // The whole model's gradient norm over the mesh (stages summed over `stage_group`, tp shards
  // over sharded's group, the copy not counted), then the clip; returns the norm before.
  double clip_grad_norm(double max_norm,
                        const c10::intrusive_ptr<c10d::ProcessGroup>& stage_group) const;
  // Every stage's parameters for gather_full_state (the copy left out), this rank's values on
  // its own stage.
  std::vector<std::vector<StagedParameter>> staged() const;
  torch::OrderedDict<std::string, torch::Tensor> full_state(distributed::DeviceMesh& mesh) const;
  // This rank's parameters as checkpoint sources (the copy under the tie's name), and its
  // checkpoint slots: saving, those it writes by the writer rule on `mesh`.
  std::vector<ParameterSource> sources() const;
  ParameterSlots slots(std::shared_ptr<distributed::DeviceMesh> mesh) const;

 private:
  std::vector<pipeline::PipelineBlock> blocks_;
  std::vector<std::vector<int>> groups_;
  int stage_;
  Tie tie_;
  std::shared_ptr<const tensor_parallel::ShardedParameters> sharded_;
  pipeline::PipelineStage mine_;
};

}  // namespace shardwise::training
