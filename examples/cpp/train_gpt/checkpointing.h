// Resumable checkpoints of the C++ trainer in shardwise-train's format
// (shardwise/checkpoint/training_checkpoint.h): a run saved here resumes in shardwise-train
// (`torchrun -m shardwise.train` with checkpoint.dir pointing at the same folder's parent) and
// the other way round. Each rank writes its FSDP shards and their AdamW moments as checkpoint
// pieces, its generator state and the data stream's position; loading fills this rank's shards
// from the pieces of every saved rank, so any world size resumes any other.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <shardwise/shardwise.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

// What a strategy exposes for checkpoints.
struct CheckpointHooks {
  // This rank's parameter slots and their AdamW moments (create: moments made for loading).
  std::function<std::vector<shardwise::sharding::TensorSlice>(bool create)> slots;
  std::function<int64_t()> optimizer_step;
  std::function<void(int64_t)> set_optimizer_step;
};

// The step the newest intact checkpoint under `directory` was saved at (0 when there is none),
// after loading it: shards and moments from every saved rank's pieces, AdamW's step count, the
// data position and (at the same world size) this rank's generator state.
inline int64_t resume_from(const std::string& directory,
                           const CheckpointHooks& hooks,
                           shardwise::data::TokenStream& stream,
                           const shardwise::distributed::World& world) {
  auto loaded = shardwise::checkpoint::load_latest_training_checkpoint(directory);
  if (world.rank() == 0 && loaded) {
    for (const auto& reason : loaded->skipped) std::printf("warning: %s\n", reason.c_str());
  }
  if (!loaded) return 0;
  std::vector<shardwise::sharding::TensorSlice> pieces;
  for (const auto& saved : loaded->ranks) {
    pieces.insert(pieces.end(), saved.pieces.begin(), saved.pieces.end());
  }
  {
    at::NoGradGuard no_grad;
    shardwise::sharding::fill_from_pieces(hooks.slots(/*create=*/true), pieces, /*strict=*/true);
  }
  const auto& first = loaded->ranks[0];
  hooks.set_optimizer_step(first.optimizer_step);
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
  state.optimizer_step = hooks.optimizer_step();
  state.rng = at::detail::getDefaultCPUGenerator().get_state();
  state.data_epoch = stream.epoch();
  state.data_index = stream.index();
  state.pieces = hooks.slots(/*create=*/false);
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
