// The model under each of train_gpt's strategies (FSDP, ZeRO-1/2, tensor parallel; the pipeline
// is pipeline_strategy.h): a whole training step, the full parameters, the data this rank reads,
// the learning-rate setter and the checkpoint hooks.
#pragma once

#include <shardwise/shardwise.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flags.h"
#include "gpt.h"
#include "gpt_tensor_parallel.h"

// The mean cross-entropy of the logits against the next tokens.
inline torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat).reshape({-1, logits.size(-1)}), targets.reshape(-1));
}

// The model under one strategy: a whole training step (forward, backward, clip, optimizer step,
// zero_grad) returning this rank's loss (undefined on ranks that compute none: a pipeline's
// earlier stages), the full parameters by name (collective; complete on rank 0), and which part
// of the data this rank reads.
struct Strategy {
  std::function<torch::Tensor(const torch::Tensor& inputs, const torch::Tensor& targets)> step;
  std::function<torch::OrderedDict<std::string, torch::Tensor>()> full_state;
  int data_rank = 0, data_world = 1;
  std::function<void(double)> set_lr;
  shardwise::training::CheckpointHooks checkpoint;
  std::string mesh;  // the mesh's layout (MeshLayout::describe()); empty without one
};

// Every parameter group's learning rate.
inline std::function<void(double)> lr_setter(std::shared_ptr<torch::optim::Optimizer> optimizer) {
  return [optimizer](double lr) {
    for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
  };
}

// The run's mesh: --tp and --pp resolved with the world by the one layout rule (ParallelLayout:
// tp ranks adjacent, pp outermost, the rest data parallel), the same layout shardwise-train
// builds; every replica starts from rank 0's weights.
inline std::shared_ptr<shardwise::distributed::DeviceMesh> data_parallel_mesh(
    GPT model, int tp, int pp, const shardwise::distributed::World& world) {
  shardwise::mesh::ParallelLayoutOptions options;
  options.world_size = world.size();
  options.tensor_parallel_size = tp;
  options.pipeline_parallel_size = pp;
  options.keys = {"WORLD_SIZE", "--tp", "--pp"};
  const shardwise::mesh::ParallelLayout layout(options);
  shardwise::distributed::broadcast_module(*model, *world.group);
  return std::make_shared<shardwise::distributed::DeviceMesh>(world, layout.layout("dp"));
}

// The fused AdamW every strategy but ZeRO uses (shardwise-train's betas and weight decay).
inline std::shared_ptr<shardwise::optim::FusedAdamW> fused_adamw(std::vector<torch::Tensor> params,
                                                                 const Flags& flags) {
  return std::make_shared<shardwise::optim::FusedAdamW>(
      std::move(params), torch::optim::AdamWOptions(flags.lr).betas({0.9, 0.95}).weight_decay(0.1));
}

// FSDP: every block its own unit, the embeddings and final norm the root; the fused AdamW steps
// the fp32 shards.
inline Strategy fsdp(GPT model, const Flags& flags, const shardwise::distributed::World& world) {
  shardwise::fsdp::FullyShardOptions options;
  options.shard_group = world.group;
  if (flags.dtype == "bf16") options.param_dtype = at::kBFloat16;
  options.reduce_dtype = at::kFloat;
  auto wrapper = std::make_shared<shardwise::fsdp::FullyShardedDataParallel<GPT>>(
      model, options, std::vector<torch::nn::Sequential*>{&model->blocks});
  auto optimizer = fused_adamw(wrapper->parameters(), flags);
  const double clip = flags.clip;
  Strategy out{
      [wrapper, optimizer, clip](const torch::Tensor& inputs, const torch::Tensor& targets) {
        auto loss = gpt_loss(wrapper->forward(inputs), targets);
        loss.backward();
        if (clip > 0) wrapper->clip_grad_norm_(clip);
        optimizer->step();
        optimizer->zero_grad();
        return loss.detach();
      },
      [wrapper] { return wrapper->full_state_dict(); }, world.rank(), world.size(),
      lr_setter(optimizer)};
  out.checkpoint = shardwise::training::adamw_checkpoint(
      [wrapper](bool) { return std::make_pair(wrapper->shard_slices(), wrapper->parameters()); },
      optimizer);
  return out;
}

// ZeRO-1/2: the model whole on every rank (rank 0's weights), the optimizer state (and with
// stage 2 the gradients) partitioned.
inline Strategy zero(GPT model, const Flags& flags, const shardwise::distributed::World& world) {
  shardwise::distributed::broadcast_module(*model, *world.group);
  shardwise::zero::ZeroOptions options;
  options.stage = flags.strategy == "zero1" ? 1 : 2;
  options.group = world.group;
  options.gradient_clipping = flags.clip;
  options.optimizer.lr = flags.lr;
  options.optimizer.beta2 = 0.95;
  options.optimizer.weight_decay = 0.1;
  auto optimizer =
      std::make_shared<shardwise::zero::ZeroRedundancyOptimizer>(model->parameters(), options);
  return {[model, optimizer](const torch::Tensor& inputs, const torch::Tensor& targets) mutable {
            auto loss = gpt_loss(model->forward(inputs), targets);
            loss.backward();
            optimizer->step();
            optimizer->zero_grad();
            return loss.detach();
          },
          [model] { return model->named_parameters(); },
          world.rank(),
          world.size(),
          lr_setter(optimizer),
          shardwise::training::zero_checkpoint(optimizer)};
}

// Tensor parallelism over groups of --tp adjacent ranks, the world / --tp groups data parallel
// (gradients averaged over them); clipping takes the whole model's norm (split gradients summed
// over the tp group, replicated ones counted once).
inline Strategy tensor_parallel(GPT model,
                                const Flags& flags,
                                const shardwise::distributed::World& world) {
  auto mesh = data_parallel_mesh(model, static_cast<int>(flags.tp), 1, world);
  auto tp_group = mesh->group({"tp"});
  auto dp_group = mesh->size("dp") > 1 ? mesh->group({"dp"}) : nullptr;
  auto sharded = std::make_shared<TensorParallelGPT>(model, tp_group);
  auto optimizer = fused_adamw(sharded->params().tensors(), flags);
  const double clip = flags.clip;
  auto step = [sharded, optimizer, clip, tp_group, dp_group](const torch::Tensor& inputs,
                                                             const torch::Tensor& targets) {
    auto loss = sharded->loss(sharded->forward(inputs), targets);
    loss.backward();
    const auto& params = sharded->params();
    if (dp_group) shardwise::distributed::average_gradients(params.tensors(), *dp_group);
    if (clip > 0) {
      shardwise::tensor_parallel::ClipOptions options;
      options.max_norm = clip;
      options.tp_group = tp_group;
      shardwise::training::clip_grad_norm_over_mesh(
          shardwise::training::mesh_gradients(
              params.named(), [&params](const std::string& n) { return params.split(n); }),
          options);
    }
    optimizer->step();
    optimizer->zero_grad();
    return loss.detach();
  };
  auto slots = [sharded, mesh](bool saving) {
    auto sources = sharded->sources();
    namespace training = shardwise::training;
    return training::source_slots(
        saving ? training::written_sources(sources, mesh->layout(), mesh->rank()) : sources);
  };
  return {step,
          [sharded] { return sharded->full_state(); },
          mesh->coordinate("dp"),
          mesh->size("dp"),
          lr_setter(optimizer),
          shardwise::training::adamw_checkpoint(slots, optimizer),
          mesh->layout().describe()};
}
