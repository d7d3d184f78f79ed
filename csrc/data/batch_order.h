// Which items each data rank reads, batch after batch: the one sampling rule of the training
// data, for the token windows of a corpus (data/token_stream.h) and for the items of a map-style
// dataset (Python's shardwise.Trainer), so both split a global batch the same way.
//
// Items 0 .. num_items - 1. Every epoch they are permuted by torch's CPU generator seeded with
// (seed * 1000003 + epoch) mod 2^63 (shuffle false: kept in order). Global batch b of an epoch
// is slice [b * micro_batch * data_world, (b + 1) * micro_batch * data_world) of that order, and
// data rank r reads its positions r, r + data_world, ...: the ranks read disjoint items whose
// union is the global batch, whatever data_world is. Items that do not fill a global batch are
// dropped, so every rank has `batches_per_epoch` batches and collectives stay in lockstep.
//
// `contiguous` (deterministic training): rank r reads positions [r * micro_batch, (r + 1) *
// micro_batch) of the slice instead, so the micro-batch a rank computes is micro-batch r of the
// global batch's data_world: global batch b's micro-batch m is the same items whatever
// data_world is, and the training step can sum the micro-batches in a tree over m.
//
// `batches_per_step` (deterministic training: the gradient-accumulation steps): an epoch keeps
// whole training steps of batches_per_step global batches, dropping the items that do not fill
// one. A step reads micro_batch * data_world * batches_per_step items whatever the split, so the
// epoch ends at the same item at every data_world and the next epoch reads the same batches.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace shardwise::data {

struct BatchOrderOptions {
  int64_t micro_batch = 0;
  int data_rank = 0;
  int data_world = 1;
  int64_t seed = 0;
  bool shuffle = true;
  bool contiguous = false;
  int64_t batches_per_step = 1;
};

class BatchOrder {
 public:
  // Throws std::invalid_argument naming the option when a size is not positive, data_rank is
  // outside [0, data_world), or the items do not fill one global batch.
  BatchOrder(int64_t num_items, BatchOrderOptions options);

  // Global batches of micro_batch * data_world in num_items, in whole steps of
  // batches_per_step (0 when no step fits).
  static int64_t whole_batches(int64_t num_items,
                               int64_t micro_batch,
                               int data_world,
                               int64_t batches_per_step = 1);
  // What one training step reads, for errors: "2 x 4 data ranks" (" x 2 batches per step").
  static std::string step_text(int64_t micro_batch, int data_world, int64_t batches_per_step);

  // The items of `epoch` in global order (the same on every rank).
  at::Tensor order(int64_t epoch) const;
  // The items this rank reads for batch `index` of `epoch` (int64, micro_batch of them).
  at::Tensor batch_items(int64_t epoch, int64_t index);
  // The items of the batch at the position, which then moves to the next batch.
  at::Tensor next();

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }
  // Restores a position (the next batch to read); throws when it is out of range.
  void load_state(int64_t epoch, int64_t index);

 private:
  int64_t num_items_ = 0;
  BatchOrderOptions options_;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  int64_t order_epoch_ = -1;
  at::Tensor order_;
};

}  // namespace shardwise::data
