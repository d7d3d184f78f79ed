// Resumable training checkpoints in shardwise-train's format (python/shardwise/train/), so a run
// saved by a LibTorch trainer resumes in shardwise-train and the other way round.
//
// Each rank writes one payload (rank-NNNNN.pt, read by Python's torch.load(weights_only=True);
// torch::pickle_load reads Python's): {"step", "optimizer_step", "rng" (this rank's CPU generator
// state), "data" ({"epoch", "index"}: the TokenStream's position), "pieces" (this rank's
// checkpoint pieces, sharding/checkpoint_pieces.h: parameters by their full model's names and
// their AdamW moments as "name:exp_avg" / "name:exp_avg_sq"), "scaler": None}; a ZeRO run writes
// "zero" ({"pieces": the ZeroOptimizer's state pieces, "step", "scaler": None, "micro_steps"})
// instead of "pieces". The folder, the manifest and their crash safety are checkpoint_dir.h's.
// Pieces of either kind load at any world size.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/resume_agreement.h"
#include "sharding/checkpoint_pieces.h"
#include "zero/zero_optimizer.h"

namespace shardwise::checkpoint {

// ZeRO's own pieces (zero/zero_optimizer.h: master weights and moments by parameter index).
struct ZeroCheckpoint {
  std::vector<zero::StatePiece> pieces;
  int64_t step = 0;         // the ZeRO optimizer's step count
  int64_t micro_steps = 0;  // micro-batches taken (gradient accumulation's position)
};

struct TrainingState {
  int64_t step = 0;            // optimizer steps taken when saved
  int64_t optimizer_step = 0;  // AdamW's step count (bias correction)
  at::Tensor rng;              // this rank's CPU generator state (torch.get_rng_state())
  int64_t data_epoch = 0, data_index = 0;
  std::vector<sharding::TensorSlice> pieces;  // FSDP and replicated strategies
  std::optional<ZeroCheckpoint> zero;         // set: a ZeRO checkpoint (and no `pieces`)
};

c10::IValue to_payload(const TrainingState& state);
// Throws c10::ValueError naming `where` and the field for a payload that is not one.
TrainingState from_payload(const c10::IValue& payload, const std::string& where);

struct SaveOptions {
  std::string directory;  // the checkpoints folder (step-NNNNNNNN/ inside)
  int rank = 0;
  int world_size = 1;
  std::string config_yaml;        // recorded in the manifest
  int keep_last = 3;              // complete checkpoints kept (>= 1)
  std::function<void()> barrier;  // over every rank; may be empty with one rank
};

// Collective: every rank writes its file, then (after the barrier) rank 0 writes the manifest and
// prunes, then a second barrier. Returns the step folder.
std::string save_training_checkpoint(const TrainingState& state, const SaveOptions& options);

struct LoadOptions {
  std::string directory;  // the checkpoints folder (step-NNNNNNNN/ inside)
  int rank = 0;
  int world_size = 1;
  std::function<int64_t(int64_t)> broadcast_step;  // rank 0's step to all (resume_agreement.h)
  std::function<void()> barrier;                   // over every rank; may be empty with one rank
};

struct LoadedCheckpoint {
  std::string path;
  Manifest manifest;
  std::vector<TrainingState> ranks;  // every saved rank's state, by rank
  std::vector<std::string> skipped;  // rank 0: newer checkpoints passed over, with the reasons
  std::vector<std::string> removed;  // rank 0: temporary files of killed writes, deleted
};

// Collective: the checkpoint rank 0 chose (agree_on_checkpoint: the newest intact one, after
// removing killed writes' temporary files), every saved rank's payload read, then a barrier so
// that no rank saves into a folder another still reads. nullopt when there is none. Call it
// before any rank saves.
std::optional<LoadedCheckpoint> load_latest_training_checkpoint(const LoadOptions& options);
// One process: the same with world_size 1.
std::optional<LoadedCheckpoint> load_latest_training_checkpoint(const std::string& directory);

}  // namespace shardwise::checkpoint
