// train_gpt's pipeline strategy (--pp, with --tp each stage tensor parallel).
#pragma once

#include <shardwise/shardwise.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "flags.h"
#include "gpt.h"
#include "gpt_pipeline.h"
#include "gpt_tensor_parallel.h"
#include "strategies.h"

// This rank's view of the cut: every block of the GPT (this rank's tp shards with --tp), the
// blocks of each stage, and this rank's stage.
struct StageCut {
  std::vector<GPTBlock> blocks;
  std::vector<std::vector<int>> groups;  // per stage, its blocks
  int stage = 0;
};

// The whole model's norm clip (training::clip_grad_norm_over_mesh): the stages summed, with tp
// shards their squares summed over the tp group, the head's copy of the tie scaled but counted
// on the first stage only.
inline std::function<void()> pipeline_clip(std::shared_ptr<TensorParallelGPT> sharded,
                                           shardwise::pipeline::PipelineStage mine,
                                           c10::intrusive_ptr<c10d::ProcessGroup> stage_group,
                                           double max_norm) {
  return [sharded, mine, stage_group, max_norm] {
    auto split = [sharded](const std::string& name) {
      return sharded && sharded->params().split(name);
    };
    shardwise::tensor_parallel::ClipOptions options;
    options.max_norm = max_norm;
    if (sharded) options.tp_group = sharded->params().group();
    options.stage_group = stage_group;
    shardwise::training::clip_grad_norm_over_mesh(
        shardwise::training::mesh_gradients(mine.parameters, split, {"head.weight"}), options);
  };
}

// Every stage's parameters by the full model's names (the head's copy of the tie left out: it is
// saved as embed.weight), this rank's values on its own stage.
inline std::vector<std::vector<shardwise::training::StagedParameter>> staged_parameters(
    const StageCut& cut, const std::shared_ptr<TensorParallelGPT>& sharded) {
  std::vector<std::vector<shardwise::training::StagedParameter>> stages(cut.groups.size());
  for (size_t s = 0; s < cut.groups.size(); ++s) {
    for (int i : cut.groups[s]) {
      for (const auto& [name, p] : cut.blocks[i].parameters) {
        if (name == "head.weight") continue;
        stages[s].push_back({name, sharded ? sharded->params().full_shape(name) : p.sizes().vec(),
                             static_cast<int>(s) == cut.stage ? p : torch::Tensor()});
      }
    }
  }
  return stages;
}

// The checkpoint slots of this rank's stage (the head's copy of the tie as embed.weight's,
// written from the first stage only).
inline shardwise::training::ParameterSlots pipeline_slots(
    std::shared_ptr<shardwise::distributed::DeviceMesh> mesh,
    shardwise::pipeline::PipelineStage mine,
    std::shared_ptr<TensorParallelGPT> sharded) {
  namespace training = shardwise::training;
  return [mesh, mine, sharded](bool saving) {
    std::vector<training::ParameterSource> sources;
    for (const auto& [name, p] : mine.parameters) {
      sources.push_back(sharded ? sharded->source(name, p)
                                : training::ParameterSource{model_name(name), p});
    }
    if (saving)
      sources = training::written_sources(sources, mesh->layout(), mesh->rank(), {"embed.weight"});
    return training::source_slots(sources);
  };
}

// This rank's cut: the blocks split by parameters into `pp` contiguous stages.
inline StageCut stage_cut(std::vector<GPTBlock> blocks, int pp, int stage) {
  auto groups = shardwise::pipeline::cut_by_parameters(blocks, pp);
  return {std::move(blocks), std::move(groups), stage};
}

// A pipeline of --pp stages (cut_by_parameters over the GPT's blocks), one per rank of each
// pipeline, with --tp each stage's blocks tensor parallel (TensorParallelGPT) over groups of --tp
// adjacent ranks; the world / (pp x tp) pipelines are data parallel (their replicated stages'
// gradients averaged by the Pipeline). The token embedding on the first stage and the head's copy
// on the last are tied. The fused AdamW steps this rank's stage; clipping takes the whole model's
// norm (stages summed, tp shards summed, the tie counted once).
inline Strategy pipelined(GPT model,
                          const Flags& flags,
                          const shardwise::distributed::World& world) {
  const int pp = static_cast<int>(flags.pp), tp = static_cast<int>(flags.tp);
  auto mesh = data_parallel_mesh(model, tp, pp, world);
  auto sharded = tp > 1 ? std::make_shared<TensorParallelGPT>(model, mesh->group({"tp"})) : nullptr;
  const torch::Tensor head = (sharded ? sharded->params().at("embed.weight") : model->embed->weight)
                                 .detach()
                                 .clone()
                                 .requires_grad_(true);
  const StageCut cut = stage_cut(sharded ? sharded->blocks(head) : gpt_blocks(model, head), pp,
                                 mesh->coordinate("pp"));
  shardwise::pipeline::PipelineOptions options;
  options.schedule = shardwise::pipeline::make_schedule(
      {flags.schedule == "gpipe" ? shardwise::pipeline::ScheduleKind::kGPipe
                                 : shardwise::pipeline::ScheduleKind::k1F1B,
       pp, static_cast<int>(flags.microbatches), 1});
  options.rank = cut.stage;
  options.group = mesh->group({"pp"});
  if (mesh->size("dp") > 1) options.data_parallel_group = mesh->group({"dp"});
  options.tied = {{0, "embed.weight", pp - 1, "head.weight"}};
  options.loss = gpt_loss;
  if (sharded) {
    options.loss = [sharded](const auto& o, const auto& t) { return sharded->loss(o, t); };
  }
  const auto mine = shardwise::pipeline::stage_of(cut.blocks, cut.groups[cut.stage], cut.stage);
  auto pipeline = std::make_shared<shardwise::pipeline::Pipeline>(
      std::vector<shardwise::pipeline::PipelineStage>{mine}, options);
  auto optimizer = fused_adamw(pipeline->parameters(), flags);
  auto step = [pipeline, optimizer, clip = pipeline_clip(sharded, mine, options.group, flags.clip),
               max_norm = flags.clip, last = cut.stage == pp - 1](const torch::Tensor& inputs,
                                                                  const torch::Tensor& targets) {
    const auto result = pipeline->step(inputs, targets);
    if (max_norm > 0) clip();
    optimizer->step();
    optimizer->zero_grad();
    return last ? torch::tensor(result.loss, torch::kFloat64) : torch::Tensor();
  };
  return {step,
          [mesh, stages = staged_parameters(cut, sharded), sharded] {
            shardwise::training::GatherTp gather;
            if (sharded)
              gather = [sharded](const auto& n, const auto& v) {
                return sharded->params().gather(n, v);
              };
            return shardwise::training::gather_full_state(*mesh, stages, gather);
          },
          mesh->coordinate("dp"),
          mesh->size("dp"),
          lr_setter(optimizer),
          shardwise::training::adamw_checkpoint(pipeline_slots(mesh, mine, sharded), optimizer),
          mesh->layout().describe()};
}
