// Rank 0 cleans up and chooses; every rank takes rank 0's step (see resume_agreement.h).
#include "checkpoint/resume_agreement.h"

#include <filesystem>
#include <stdexcept>

#include "checkpoint/checkpoint_dir.h"

namespace shardwise::checkpoint {

AgreedCheckpoint agree_on_checkpoint(const AgreeOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw std::invalid_argument("agree_on_checkpoint: rank " + std::to_string(options.rank) +
                                " outside [0, world_size " + std::to_string(options.world_size) +
                                ")");
  }
  if (options.world_size > 1 && !options.broadcast_step) {
    throw std::invalid_argument("agree_on_checkpoint: broadcast_step is needed with " +
                                std::to_string(options.world_size) +
                                " ranks (each rank choosing alone can pick a different one)");
  }
  AgreedCheckpoint agreed;
  int64_t step = -1;
  if (options.rank == 0) {
    agreed.removed = remove_temporary_files(options.directory);
    if (auto found = latest(options.directory, &agreed.skipped)) step = found->manifest.step;
  }
  if (options.world_size > 1) step = options.broadcast_step(step);
  if (step < -1) {
    throw std::runtime_error("agree_on_checkpoint: rank " + std::to_string(options.rank) +
                             " received step " + std::to_string(step) + " from rank 0");
  }
  if (step >= 0) {
    agreed.path = (std::filesystem::path(options.directory) / step_dir_name(step)).string();
  }
  return agreed;
}

}  // namespace shardwise::checkpoint
