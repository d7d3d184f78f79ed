// train_gpt's pipeline strategy (--pp, with --tp each stage tensor parallel).
#pragma once

#include <shardwise/shardwise.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "checkpointing.h"
#include "flags.h"
#include "gpt.h"
#include "gpt_pipeline.h"
#include "gpt_tensor_parallel.h"
#include "strategies.h"

// Scales `grads` by max_norm / (norm + 1e-6) when that is below 1 (torch's clip_grad_norm_).
inline void scale_to(const std::vector<torch::Tensor>& grads, double norm, double max_norm) {
  if (max_norm / (norm + 1e-6) < 1.0) {
    for (const auto& g : grads) g.mul_(max_norm / (norm + 1e-6));
  }
}

// This rank's view of the cut: every block of the GPT (this rank's tp shards with --tp), the
// blocks of each stage, and this rank's stage.
struct StageCut {
  std::vector<GPTBlock> blocks;
  std::vector<std::vector<int>> groups;  // per stage, its blocks
  int stage = 0;
};

// The pipeline's norm clip of this rank's stage. With tp shards the norm sums the squares of the
// split gradients over the tp group and of all over the stages, the head's copy of the tie left
// out (tensor_parallel::clip_grad_norm_); without, Pipeline::clip_grad_norm_.
inline std::function<void()> pipeline_clip(std::shared_ptr<shardwise::pipeline::Pipeline> pipeline,
                                           std::shared_ptr<TensorParallelGPT> sharded,
                                           shardwise::pipeline::PipelineStage mine,
                                           c10::intrusive_ptr<c10d::ProcessGroup> stage_group,
                                           double max_norm) {
  if (!sharded) return [pipeline, max_norm] { pipeline->clip_grad_norm_(max_norm); };
  return [sharded, mine, stage_group, max_norm] {
    std::vector<torch::Tensor> split, replicated, all;
    for (const auto& [name, p] : mine.parameters) {
      if (!p.grad().defined()) continue;
      all.push_back(p.grad());
      if (name != "head.weight") (sharded->split(name) ? split : replicated).push_back(p.grad());
    }
    shardwise::tensor_parallel::ClipOptions options;  // max_norm 0: measure only
    options.tp_group = sharded->group();
    options.stage_group = stage_group;
    scale_to(all, shardwise::tensor_parallel::clip_grad_norm_(split, replicated, options),
             max_norm);
  };
}

// The full parameters on rank 0 (collective): the first pipeline's stages gather their tp shards
// and tp rank 0's pipeline sends them to its stage 0.
inline std::function<torch::OrderedDict<std::string, torch::Tensor>()> pipeline_full_state(
    std::shared_ptr<shardwise::distributed::DeviceMesh> mesh,
    StageCut cut,
    std::shared_ptr<TensorParallelGPT> sharded) {
  return [mesh, cut, sharded, group = mesh->group({"pp"})] {
    torch::OrderedDict<std::string, torch::Tensor> full;
    if (mesh->coordinate("dp") != 0) return full;
    const bool sends = mesh->coordinate("tp") == 0;
    const int stage = cut.stage;
    for (int s = 0; s < static_cast<int>(cut.groups.size()); ++s) {
      for (int i : cut.groups[s]) {
        for (const auto& [name, p] : cut.blocks[i].parameters) {
          if (name == "head.weight") continue;  // the tie's copy (saved as embed.weight's)
          std::vector<torch::Tensor> tensor{p.detach().contiguous()};
          if (s == stage && sharded) tensor[0] = sharded->gather(name, p);  // collective over tp
          if (s != stage && stage == 0 && sends) {
            tensor[0] = torch::empty(sharded ? sharded->full_shape(name) : p.sizes().vec());
            group->recv(tensor, s, 0)->wait();
          }
          if (s == stage && stage != 0 && sends) group->send(tensor, 0, 0)->wait();
          if (stage == 0 && sends) full.insert(name, tensor[0].clone());
        }
      }
    }
    return full;
  };
}

// The checkpoint slots of this rank's stage (the head's copy of the tie as embed.weight's).
inline ParameterSlots pipeline_slots(std::shared_ptr<shardwise::distributed::DeviceMesh> mesh,
                                     shardwise::pipeline::PipelineStage mine,
                                     std::shared_ptr<TensorParallelGPT> sharded) {
  return [mesh, mine, sharded](bool saving) {
    std::vector<ParameterSource> sources;
    for (const auto& [name, p] : mine.parameters) {
      sources.push_back(sharded ? sharded->source(name, p) : ParameterSource{model_name(name), p});
    }
    return source_slots(saving ? written(sources, *mesh, /*holds_the_head_copy=*/true) : sources);
  };
}

// This rank's cut: the blocks split by parameters into `pp` contiguous stages.
inline StageCut stage_cut(std::vector<GPTBlock> blocks, int pp, int stage) {
  std::vector<std::vector<torch::Tensor>> block_parameters;
  for (const auto& b : blocks) {
    block_parameters.emplace_back();
    for (const auto& [name, p] : b.parameters) block_parameters.back().push_back(p);
  }
  auto groups = shardwise::pipeline::stage_groups(
      shardwise::pipeline::split_by_parameters(block_parameters, pp),
      static_cast<int>(blocks.size()));
  return {std::move(blocks), std::move(groups), stage};
}

// A pipeline of --pp stages (split_by_parameters over the GPT's blocks), one per rank of each
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
  const torch::Tensor head = (sharded ? sharded->parameter("embed.weight") : model->embed->weight)
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
  const auto mine = gpt_stage(cut.blocks, cut.groups[cut.stage], cut.stage);
  auto pipeline = std::make_shared<shardwise::pipeline::Pipeline>(
      std::vector<shardwise::pipeline::PipelineStage>{mine}, options);
  auto optimizer = fused_adamw(pipeline->parameters(), flags);
  auto step = [pipeline, optimizer,
               clip = pipeline_clip(pipeline, sharded, mine, options.group, flags.clip),
               max_norm = flags.clip, last = cut.stage == pp - 1](const torch::Tensor& inputs,
                                                                  const torch::Tensor& targets) {
    const auto result = pipeline->step(inputs, targets);
    if (max_norm > 0) clip();
    optimizer->step();
    optimizer->zero_grad();
    return last ? torch::tensor(result.loss, torch::kFloat64) : torch::Tensor();
  };
  return {step,
          pipeline_full_state(mesh, cut, sharded),
          mesh->coordinate("dp"),
          mesh->size("dp"),
          lr_setter(optimizer),
          adamw_checkpoint(pipeline_slots(mesh, mine, sharded), optimizer),
          mesh->layout().describe()};
}
