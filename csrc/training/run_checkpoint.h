// Saving and resuming a training run's step (collective over the world): the strategy's part
// (checkpoint_hooks.h), the data stream's position and each rank's generator state, written in
// shardwise-train's format, so a run saved by a LibTorch loop resumes in shardwise-train and the
// other way round.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/token_stream.h"
#include "distributed/process_group.h"
#include "training/checkpoint_hooks.h"

namespace shardwise::training {

struct RunCheckpointOptions {
  std::string directory;    // the run's checkpoint folder (one step-N folder per save)
  int keep_last = 3;        // older complete checkpoints are removed after a save
  std::string config_yaml;  // the run's settings, recorded in the manifest
};

// This rank's state at step `step`: the strategy's part, the generator state and the data
// position (what save_training_step writes).
checkpoint::TrainingState training_state(int64_t step,
                                         const CheckpointHooks& hooks,
                                         const data::TokenStream& stream);

// Saves step `step` (collective): every rank writes its state, rank 0 the manifest.
void save_training_step(int64_t step,
                        const CheckpointHooks& hooks,
                        const data::TokenStream& stream,
                        const distributed::World& world,
                        const RunCheckpointOptions& options);

// What resume_training found.
struct Resumed {
  int64_t step = 0;                  // the step saved; 0: nothing to resume (a fresh run)
  std::string path;                  // the checkpoint loaded
  int saved_world = 0;               // how many ranks saved it
  std::vector<std::string> removed;  // unfinished writes removed (rank 0)
  std::vector<std::string> skipped;  // why newer checkpoints were passed over (rank 0)

  // The lines shardwise-train prints about it: each write removed, each checkpoint passed over
  // ("warning: ..."), and the checkpoint loaded.
  std::vector<std::string> report() const;
};

// Loads the newest intact checkpoint under `directory` that rank 0 chose (collective): the
// strategy's pieces from every saved rank, the data position and, at the same world size, this
// rank's generator state.
Resumed resume_training(const std::string& directory,
                        const CheckpointHooks& hooks,
                        data::TokenStream& stream,
                        const distributed::World& world);

}  // namespace shardwise::training
