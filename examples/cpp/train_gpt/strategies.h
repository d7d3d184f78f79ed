// The model under each of train_gpt's strategies (FSDP, ZeRO-1/2, tensor parallel; the pipeline
// is pipeline_strategy.h): a whole training step, the full parameters, the data this rank reads
// and the checkpoint hooks.
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

// The model under one strategy: its forward and backward on a micro-batch (the loss divided by
// `divisor` before the backward), returning this rank's losses, 1-D float64 (a pipeline's: one
// per microbatch; undefined on ranks that compute none: a pipeline's earlier stages), the clip
// over the whole model (null: the optimizer clips), the optimizer, the full parameters by name
// (collective; complete on rank 0), which part of the data this rank reads and its data group
// (null with one data rank), and the checkpoint hooks.
struct Strategy {
  std::function<torch::Tensor(
      const torch::Tensor& inputs, const torch::Tensor& targets, double divisor)>
      backward;
  std::function<void(double max_norm)> clip;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  std::function<torch::OrderedDict<std::string, torch::Tensor>()> full_state;
  int data_rank = 0, data_world = 1;
  shardwise::training::CheckpointHooks checkpoint;
  std::string mesh;  // the mesh's layout (MeshLayout::describe()); empty without one
  c10::intrusive_ptr<c10d::ProcessGroup> data_group;

  using Batch = std::pair<torch::Tensor, torch::Tensor>;  // (inputs, targets)
  // One training step at learning rate `lr` over the accumulation's micro-batches: forward and
  // backward of each (its loss divided by `divisor`), clip, optimizer step, zero_grad. Returns
  // each backward's losses (undefined where none).
  std::vector<torch::Tensor> step(const std::vector<Batch>& batches,
                                  double divisor,
                                  double lr,
                                  double max_norm) const {
    for (auto& group : optimizer->param_groups()) group.options().set_lr(lr);
    std::vector<torch::Tensor> losses;
    for (const auto& [inputs, targets] : batches) {
      losses.push_back(backward(inputs, targets, divisor));
    }
    if (clip && max_norm > 0) clip(max_norm);
    optimizer->step();
    optimizer->zero_grad();
    return losses;
  }
};

// One micro-batch's forward and backward through `forward`: the loss over `divisor`
// backpropagated, the loss itself returned (1 element, float64).
template <typename Forward>
torch::Tensor micro_batch_backward(Forward&& forward,
                                   const torch::Tensor& inputs,
                                   const torch::Tensor& targets,
                                   double divisor) {
  const torch::Tensor loss = gpt_loss(forward(inputs), targets);
  (loss / divisor).backward();
  return loss.detach().to(torch::kFloat64).reshape({1});
}

// The run's mesh: --tp and --pp resolved with the world by the one layout rule (ParallelLayout:
// tp ranks adjacent, pp outermost, the rest data parallel), the same layout shardwise-train
// builds; every replica starts from rank 0's weights.
inline std::shared_ptr<shardwise::distributed::DeviceMesh> data_parallel_mesh(
    GPT model, int tp, int pp, const shardwise::distributed::World& world) {
  const shardwise::mesh::ParallelLayout layout(
      {world.size(), {}, tp, pp, {"WORLD_SIZE", "--tp", "--pp"}});
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
  options.deterministic = flags.deterministic;  // the tree reduce-scatter, the exact clip norm
  auto wrapper = std::make_shared<shardwise::fsdp::FullyShardedDataParallel<GPT>>(
      model, options, std::vector<torch::nn::Sequential*>{&model->blocks});
  auto optimizer = fused_adamw(wrapper->parameters(), flags);
  auto slots = [wrapper](bool) {
    return std::make_pair(wrapper->shard_slices(), wrapper->parameters());
  };
  return {[wrapper](const torch::Tensor& inputs, const torch::Tensor& targets, double divisor) {
            return micro_batch_backward([&](const auto& x) { return wrapper->forward(x); }, inputs,
                                        targets, divisor);
          },
          [wrapper](double max_norm) { wrapper->clip_grad_norm_(max_norm); },
          optimizer,
          [wrapper] { return wrapper->full_state_dict(); },
          world.rank(),
          world.size(),
          shardwise::training::adamw_checkpoint(slots, optimizer),
          "",
          world.size() > 1 ? world.group : nullptr};
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
  options.deterministic = flags.deterministic;
  auto optimizer =
      std::make_shared<shardwise::zero::ZeroRedundancyOptimizer>(model->parameters(), options);
  return {
      [model](const torch::Tensor& inputs, const torch::Tensor& targets, double divisor) mutable {
        return micro_batch_backward([&](const auto& x) { return model->forward(x); }, inputs,
                                    targets, divisor);
      },
      nullptr,  // the optimizer clips (gradient_clipping)
      optimizer,
      [model] { return model->named_parameters(); },
      world.rank(),
      world.size(),
      shardwise::training::zero_checkpoint(optimizer),
      "",
      world.size() > 1 ? world.group : nullptr};
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
  auto backward = [sharded, dp_group](const torch::Tensor& inputs, const torch::Tensor& targets,
                                      double divisor) {
    auto loss = sharded->loss(sharded->forward(inputs), targets);
    (loss / divisor).backward();
    // an average of averages: each micro-batch's share is averaged once (linear, idempotent)
    if (dp_group) shardwise::distributed::average_gradients(sharded->params().tensors(), *dp_group);
    return loss.detach().to(torch::kFloat64).reshape({1});
  };
  auto clip = [sharded, tp_group](double max_norm) {
    shardwise::tensor_parallel::ClipOptions options;
    options.max_norm = max_norm;
    options.tp_group = tp_group;
    namespace training = shardwise::training;
    training::clip_grad_norm_over_mesh(training::mesh_gradients(sharded->params()), options);
  };
  std::shared_ptr<const shardwise::tensor_parallel::ShardedParameters> params{sharded,
                                                                              &sharded->params()};
  return {backward,
          clip,
          optimizer,
          [params] { return params->full_state(); },
          mesh->coordinate("dp"),
          mesh->size("dp"),
          shardwise::training::adamw_checkpoint(
              shardwise::training::sharded_slots(params, mesh->layout(), mesh->rank()), optimizer),
          mesh->layout().describe(),
          dp_group};
}
