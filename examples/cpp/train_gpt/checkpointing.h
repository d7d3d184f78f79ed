// Resumable checkpoints of the C++ trainer in shardwise-train's format
// (shardwise/checkpoint/training_checkpoint.h): a run saved here resumes in shardwise-train
// (`torchrun -m shardwise.train` with checkpoint.dir pointing at the same folder's parent) and
// the other way round. Each rank writes what it holds of the parameters and their AdamW moments
// as checkpoint pieces of the full tensors (FSDP shards, a pipeline stage's parameters, tensor-
// parallel shards; ZeRO: the ZeRO optimizer's own pieces), its generator state and the data
// stream's position; loading fills this rank's part from the pieces of every saved rank, so any
// strategy and world size resumes any other (ZeRO only ZeRO).
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <shardwise/shardwise.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// What a strategy adds to a checkpoint (its pieces) and takes back from one.
struct CheckpointHooks {
  std::function<void(shardwise::checkpoint::TrainingState&)> save;
  // Every saved rank's state (any world size); `path` names the checkpoint in errors.
  std::function<void(const std::vector<shardwise::checkpoint::TrainingState>&,
                     const std::string& path)>
      load;
};

// A parameter this rank holds: `value` is the whole tensor `name` of the full model or, with
// `split`, its tensor-parallel shard of the `full_shape` tensor.
struct ParameterSource {
  std::string name;
  torch::Tensor value;
  std::optional<shardwise::tensor_parallel::ShardSpec> split;
  std::vector<int64_t> full_shape;
};

// Their checkpoint slots, each with the parameter it views: a shard's runs in the full tensor
// (tensor_parallel::shard_slices), a whole tensor as one slot.
inline std::pair<std::vector<shardwise::sharding::TensorSlice>, std::vector<torch::Tensor>>
source_slots(const std::vector<ParameterSource>& sources) {
  std::pair<std::vector<shardwise::sharding::TensorSlice>, std::vector<torch::Tensor>> out;
  for (const ParameterSource& source : sources) {
    const torch::Tensor flat = source.value.detach();
    auto slices =
        source.split
            ? shardwise::tensor_parallel::shard_slices(source.name, flat, source.full_shape,
                                                       *source.split)
            : std::vector<shardwise::sharding::TensorSlice>{{source.name, 0, flat.view(-1)}};
    for (auto& slice : slices) {
      out.first.push_back(std::move(slice));
      out.second.push_back(source.value);
    }
  }
  return out;
}

// The checkpoint slots of the parameters this rank holds, slots.first[i] a 1-D view of
// slots.second[i] (several slots may view one parameter). With `saving`, only the slots this rank
// writes: a replicated tensor is written by one of the ranks that hold it.
using ParameterSlots = std::function<std::pair<std::vector<shardwise::sharding::TensorSlice>,
                                               std::vector<torch::Tensor>>(bool saving)>;

// FSDP, a pipeline's stage or a tensor-parallel shard under AdamW: the parameter slots and their
// AdamW moments as pieces of the full parameters.
inline CheckpointHooks adamw_checkpoint(ParameterSlots parameter_slots,
                                        std::shared_ptr<torch::optim::AdamW> optimizer) {
  auto slots = [parameter_slots, optimizer](bool saving) {
    const auto [views, params] = parameter_slots(saving);
    return shardwise::optim::adamw_slots(views, params, *optimizer, /*create_state=*/!saving);
  };
  CheckpointHooks hooks;
  hooks.save = [slots, optimizer](shardwise::checkpoint::TrainingState& state) {
    state.pieces = slots(/*saving=*/true);
    state.optimizer_step = shardwise::optim::adamw_step_count(*optimizer);
  };
  hooks.load = [slots, optimizer](const std::vector<shardwise::checkpoint::TrainingState>& saved,
                                  const std::string& path) {
    if (saved[0].zero) {
      throw std::invalid_argument(path +
                                  ": a ZeRO checkpoint; resume it with --strategy zero1 "
                                  "or zero2");
    }
    std::vector<shardwise::sharding::TensorSlice> pieces;
    for (const auto& rank : saved)
      pieces.insert(pieces.end(), rank.pieces.begin(), rank.pieces.end());
    at::NoGradGuard no_grad;
    shardwise::sharding::fill_from_pieces(slots(/*saving=*/false), pieces, /*strict=*/true);
    shardwise::optim::set_adamw_step_count(*optimizer, saved[0].optimizer_step);
  };
  return hooks;
}

// ZeRO: the ZeroOptimizer's own state pieces (master weights and moments); loading also sets the
// model's weights.
inline CheckpointHooks zero_checkpoint(
    std::shared_ptr<shardwise::zero::ZeroRedundancyOptimizer> optimizer) {
  CheckpointHooks hooks;
  hooks.save = [optimizer](shardwise::checkpoint::TrainingState& state) {
    auto& engine = optimizer->engine();
    state.zero = shardwise::checkpoint::ZeroCheckpoint{engine.state_pieces(), engine.step_count(),
                                                       engine.step_count()};
    state.optimizer_step = engine.step_count();
  };
  hooks.load = [optimizer](const std::vector<shardwise::checkpoint::TrainingState>& saved,
                           const std::string& path) {
    if (!saved[0].zero) {
      throw std::invalid_argument(path +
                                  ": not a ZeRO checkpoint; resume it with --strategy "
                                  "fsdp");
    }
    std::vector<shardwise::zero::StatePiece> pieces;
    for (const auto& rank : saved) {
      pieces.insert(pieces.end(), rank.zero->pieces.begin(), rank.zero->pieces.end());
    }
    optimizer->engine().load_state_pieces(pieces, saved[0].zero->step);
  };
  return hooks;
}

// The step of the checkpoint rank 0 chose under `directory` (the newest intact one; 0 when there
// is none: checkpoint::load_latest_training_checkpoint),
// after loading it: the strategy's pieces from every saved rank (CheckpointHooks), the data
// position and (at the same world size) this rank's generator state.
inline int64_t resume_from(const std::string& directory,
                           const CheckpointHooks& hooks,
                           shardwise::data::TokenStream& stream,
                           const shardwise::distributed::World& world) {
  shardwise::checkpoint::LoadOptions options;  // rank 0 chooses; every rank loads its choice
  options.directory = directory;
  options.rank = world.rank();
  options.world_size = world.size();
  auto group = world.group;
  options.broadcast_step = [group](int64_t step) {
    std::vector<at::Tensor> chosen{at::full({1}, step, at::kLong)};
    group->broadcast(chosen)->wait();
    return chosen[0].item<int64_t>();
  };
  options.barrier = [group] { group->barrier()->wait(); };
  auto loaded = shardwise::checkpoint::load_latest_training_checkpoint(options);
  if (world.rank() == 0 && loaded) {
    for (const auto& path : loaded->removed)
      std::printf("removed %s: a write that never finished\n", path.c_str());
    for (const auto& reason : loaded->skipped) std::printf("warning: %s\n", reason.c_str());
  }
  if (!loaded) return 0;
  hooks.load(loaded->ranks, loaded->path);
  const auto& first = loaded->ranks[0];
  stream.load_state(first.data_epoch, first.data_index);
  const int saved_world = loaded->manifest.world_size;
  if (saved_world == world.size() && loaded->ranks[world.rank()].rng.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // shares the default
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(loaded->ranks[world.rank()].rng);
  }
  if (world.rank() == 0) {
    std::printf("resumed from %s (step %lld, saved by %d ranks)\n", loaded->path.c_str(),
                static_cast<long long>(first.step), saved_world);
    std::fflush(stdout);
  }
  return first.step;
}

// Saves step `step` (collective).
inline void save_to(const std::string& directory,
                    int64_t step,
                    int keep_last,
                    const std::string& config,
                    const CheckpointHooks& hooks,
                    const shardwise::data::TokenStream& stream,
                    const shardwise::distributed::World& world) {
  shardwise::checkpoint::TrainingState state;
  state.step = step;
  hooks.save(state);
  state.rng = at::detail::getDefaultCPUGenerator().get_state();
  state.data_epoch = stream.epoch();
  state.data_index = stream.index();
  shardwise::checkpoint::SaveOptions options;
  options.directory = directory;
  options.rank = world.rank();
  options.world_size = world.size();
  options.config_yaml = config;
  options.keep_last = keep_last;
  auto group = world.group;
  options.barrier = [group] { group->barrier()->wait(); };
  shardwise::checkpoint::save_training_checkpoint(state, options);
}
