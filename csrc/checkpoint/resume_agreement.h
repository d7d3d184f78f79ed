// Which checkpoint a multi-rank run resumes from. Ranks choosing on their own can disagree (found
// by the fault soak, tests/soak/): a fast rank that resumed at the newest step saves again at
// once, rewriting its rank file while a slower rank still verifies that folder, so the slower
// rank skips it and resumes from an older one; the ranks then deadlock in mismatched
// collectives. So rank 0 alone removes the temporary files killed writes left and picks the
// newest intact checkpoint, and broadcasts its step; every rank takes that folder. Torch-free:
// the caller's `broadcast_step` carries the step (a process group's broadcast of one int64).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace shardwise::checkpoint {

struct AgreeOptions {
  std::string directory;  // the checkpoints folder (step-NNNNNNNN/ inside)
  int rank = 0;
  int world_size = 1;
  // Returns rank 0's `step` on every rank (-1: no checkpoint). Collective; may be empty with one
  // rank.
  std::function<int64_t(int64_t step)> broadcast_step;
};

struct AgreedCheckpoint {
  std::optional<std::string> path;   // the step folder every rank loads; nullopt: start afresh
  std::vector<std::string> removed;  // rank 0: temporary files of killed writes, deleted
  std::vector<std::string> skipped;  // rank 0: newer checkpoints passed over, with the reasons
};

// Collective over every rank. Call it before any rank saves; load the folder before any rank
// saves again (save_training_checkpoint's barrier, or the caller's).
AgreedCheckpoint agree_on_checkpoint(const AgreeOptions& options);

}  // namespace shardwise::checkpoint
