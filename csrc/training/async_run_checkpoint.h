// Asynchronous checkpoints for a LibTorch training loop (shardwise-train's
// training.checkpoint.async): save() blocks the step only while the state is copied to host
// memory; a background thread then writes it exactly as save_training_step does (each rank's file
// written to a temporary name, fsynced and renamed, rank 0's manifest last, the pruning), over a
// process group of its own, so its barriers never interleave with the training's collectives.
//
//   training::AsyncRunCheckpoints saver(world, {dir, keep_last, config});  // collective
//   ... every N steps: saver.save(step, strategy.checkpoint, stream);
//   saver.wait();  // before exiting: the last save complete (its error raised here)
//
// One save in flight: save() first waits for the previous one. A crash or kill mid-write leaves
// the previous complete checkpoint, which resume_training finds.
#pragma once

#include <cstdint>
#include <exception>
#include <thread>

#include "training/run_checkpoint.h"

namespace shardwise::training {

class AsyncRunCheckpoints {
 public:
  // Collective over the world: creates the writer's group.
  AsyncRunCheckpoints(const distributed::World& world, RunCheckpointOptions options);
  // Waits for a save in flight; an error it raised is printed to stderr, not thrown.
  ~AsyncRunCheckpoints();
  AsyncRunCheckpoints(const AsyncRunCheckpoints&) = delete;
  AsyncRunCheckpoints& operator=(const AsyncRunCheckpoints&) = delete;

  // Waits for the previous save, copies step `step`'s state to host memory and starts writing
  // it; every rank calls it at the same step.
  void save(int64_t step, const CheckpointHooks& hooks, const data::TokenStream& stream);
  // Until the save in flight is complete; rethrows its error, naming the step.
  void wait();
  // Seconds the last save() held its caller (the wait for the previous save and the copy).
  double blocked_seconds() const { return blocked_seconds_; }

 private:
  int rank_ = 0;
  int world_size_ = 1;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  RunCheckpointOptions options_;
  std::thread writer_;
  std::exception_ptr error_;
  int64_t step_ = -1;  // the save in flight (or last finished)
  double blocked_seconds_ = 0.0;
};

}  // namespace shardwise::training
