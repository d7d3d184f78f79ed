// ZeRO stages 0-2 as a torch::optim optimizer: the ZeroOptimizer (zero/zero_optimizer.h) behind
// torch::optim's interface, so a LibTorch training loop, LR scheduler or checkpoint code written
// for torch::optim::AdamW takes it unchanged.
//
//   shardwise::zero::ZeroOptions zero;
//   zero.stage = 2;
//   zero.group = world.group;              // the data-parallel group
//   zero.optimizer.lr = 1e-3;
//   shardwise::zero::ZeroRedundancyOptimizer optimizer(model->parameters(), zero);
//   loss.backward();                       // stage 2: gradients reduce-scatter during backward
//   optimizer.step();                      // each rank steps its partition, then all-gathers
//   optimizer.zero_grad();
//
// The model stays whole on every rank (ZeRO-3's parameter sharding is FSDP's:
// fsdp/fully_shard.h). The learning rate is the parameter group's (set_lr, schedulers).
// save()/load() write and read this rank's state pieces: a checkpoint reloads at the same world
// size from each rank's own archive (state_pieces() gives every piece for other sizes).
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "zero/zero_optimizer.h"

namespace shardwise::zero {

struct ZeroRedundancyOptions
    : public torch::optim::OptimizerCloneableOptions<ZeroRedundancyOptions> {
  ZeroRedundancyOptions() = default;
  explicit ZeroRedundancyOptions(ZeroOptions options) : zero(std::move(options)) {}
  double get_lr() const override { return zero.optimizer.lr; }
  void set_lr(const double lr) override { zero.optimizer.lr = lr; }
  ZeroOptions zero;
};

class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  // `params`: the model's trainable parameters, contiguous, one dtype, the same on every rank;
  // options.stage 0, 1 or 2 (stage 3: FullyShardedDataParallel with FusedAdamW or
  // ZeroOptimizer::create_local).
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, ZeroOptions options);

  // Reduces (stages 0/1), unscales, clips and steps; returns the closure's loss if any.
  at::Tensor step(LossClosure closure = nullptr) override;
  // Clears the gradients and the gradient partition (hides torch::optim::Optimizer::zero_grad,
  // which would leave the partition).
  void zero_grad(bool set_to_none = true);
  // False when an fp16 overflow skipped the last step.
  bool last_step_taken() const { return last_taken_; }
  ZeroOptimizer& engine() { return *engine_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  std::shared_ptr<ZeroOptimizer> engine_;
  bool last_taken_ = true;
};

}  // namespace shardwise::zero
