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
  auto blocks = sharded ? gpt_blocks(sharded, flags.layers, head)
                        : gpt_blocks(model.ptr(), flags.layers, head);
  std::shared_ptr<const shardwise::tensor_parallel::ShardedParameters> shards;
  if (sharded) shards = {sharded, &sharded->params()};  // shares the model's ownership
  auto groups = shardwise::pipeline::cut_by_parameters(blocks, pp);
  auto cut = std::make_shared<shardwise::training::StageCut>(
      std::move(blocks), std::move(groups), mesh->coordinate("pp"),
      shardwise::training::Tie{"embed.weight", "head.weight"}, shards);
  shardwise::pipeline::PipelineOptions options;
  options.schedule = shardwise::pipeline::make_schedule(
      {flags.schedule == "gpipe" ? shardwise::pipeline::ScheduleKind::kGPipe
                                 : shardwise::pipeline::ScheduleKind::k1F1B,
       pp, static_cast<int>(flags.microbatches), 1});
  options.rank = cut->stage();
  options.group = mesh->group({"pp"});
  if (mesh->size("dp") > 1) options.data_parallel_group = mesh->group({"dp"});
  options.deterministic = flags.deterministic;  // the trees over microbatches and replicas
  options.tied = {{0, "embed.weight", pp - 1, "head.weight"}};
  options.loss = gpt_loss;
  if (sharded) {
    options.loss = [sharded](const auto& o, const auto& t) { return sharded->loss(o, t); };
  }
  auto pipeline = std::make_shared<shardwise::pipeline::Pipeline>(
      std::vector<shardwise::pipeline::PipelineStage>{cut->mine()}, options);
  auto optimizer = fused_adamw(pipeline->parameters(), flags);
  // (no accumulation with --pp: the divisor is the pipeline's own; each microbatch's loss back)
  auto backward = [pipeline, last = cut->stage() == pp - 1](const torch::Tensor& inputs,
                                                            const torch::Tensor& targets, double) {
    const auto result = pipeline->step(inputs, targets);
    return last ? torch::tensor(result.losses, torch::kFloat64) : torch::Tensor();
  };
  auto clip = [cut, pipeline, group = options.group, exact = flags.deterministic](double norm) {
    if (exact) {
      pipeline->clip_grad_norm_(norm);  // the exact norm (no tp in the mode)
    } else {
      cut->clip_grad_norm(norm, group);
    }
  };
  return {backward,
          clip,
          optimizer,
          [mesh, cut] { return cut->full_state(*mesh); },
          mesh->coordinate("dp"),
          mesh->size("dp"),
          shardwise::training::adamw_checkpoint(cut->slots(mesh), optimizer),
          mesh->layout().describe(),
          options.data_parallel_group};
}
