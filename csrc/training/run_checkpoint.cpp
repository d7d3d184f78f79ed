// The run checkpoints of run_checkpoint.h.
#include "training/run_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

#include <mutex>

namespace shardwise::training {

checkpoint::TrainingState training_state(int64_t step,
                                         const CheckpointHooks& hooks,
                                         const data::TokenStream& stream) {
  checkpoint::TrainingState state;
  state.step = step;
  hooks.save(state);
  state.rng = at::detail::getDefaultCPUGenerator().get_state();
  state.data_epoch = stream.epoch();
  state.data_index = stream.index();
  return state;
}

void save_training_step(int64_t step,
                        const CheckpointHooks& hooks,
                        const data::TokenStream& stream,
                        const distributed::World& world,
                        const RunCheckpointOptions& options) {
  const checkpoint::TrainingState state = training_state(step, hooks, stream);
  checkpoint::SaveOptions save;
  save.directory = options.directory;
  save.rank = world.rank();
  save.world_size = world.size();
  save.config_yaml = options.config_yaml;
  save.keep_last = options.keep_last;
  auto group = world.group;
  save.barrier = [group] { group->barrier()->wait(); };
  checkpoint::save_training_checkpoint(state, save);
}

Resumed resume_training(const std::string& directory,
                        const CheckpointHooks& hooks,
                        data::TokenStream& stream,
                        const distributed::World& world) {
  checkpoint::LoadOptions options;  // rank 0 chooses; every rank loads its choice
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
  auto loaded = checkpoint::load_latest_training_checkpoint(options);
  Resumed out;
  if (!loaded) return out;
  hooks.load(loaded->ranks, loaded->path);
  const auto& first = loaded->ranks[0];
  stream.load_state(first.data_epoch, first.data_index);
  out.saved_world = loaded->manifest.world_size;
  if (out.saved_world == world.size() && loaded->ranks[world.rank()].rng.defined()) {
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // shares the default
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(loaded->ranks[world.rank()].rng);
  }
  out.step = first.step;
  out.path = loaded->path;
  out.removed = loaded->removed;
  out.skipped = loaded->skipped;
  return out;
}

std::vector<std::string> Resumed::report() const {
  std::vector<std::string> lines;
  for (const auto& leftover : removed)
    lines.push_back("removed " + leftover + ": a write that never finished");
  for (const auto& reason : skipped) lines.push_back("warning: " + reason);
  if (step > 0) {
    lines.push_back("resumed from " + path + " (step " + std::to_string(step) + ", saved by " +
                    std::to_string(saved_world) + " ranks)");
  }
  return lines;
}

}  // namespace shardwise::training
