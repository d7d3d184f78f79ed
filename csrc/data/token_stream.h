// Training data for LibTorch programs, the same stream the Python trainer reads
// (python/shardwise/train/data.py), so a C++ and a Python run see the same batches.
//
// Tokens: a 1-D integer tensor (the UTF-8 bytes of a text file, or a uint16/uint32 .bin or .npy
// file from data/token_file_tensor.h, memory-mapped). Split: the last `val_fraction` of the
// tokens is the validation set (round(n * val_fraction), at least 1, Python's rounding).
// Stream: the tokens are cut into non-overlapping windows of seq_len + 1 tokens starting at
// 0, seq_len, 2 * seq_len, ...; the windows are the items of a BatchOrder (data/batch_order.h:
// shuffled per epoch, each global batch split among the data ranks, the remainder dropped).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

#include "data/batch_order.h"

namespace shardwise::data {

// The bytes of the file at `path` as a 1-D uint8 tensor; throws std::runtime_error naming the
// path when it cannot be read or is empty.
at::Tensor read_byte_tokens(const std::string& path);

// (train, validation): the last round(numel * val_fraction) tokens (at least 1) validate.
std::pair<at::Tensor, at::Tensor> split_tokens(const at::Tensor& tokens,
                                               double val_fraction = 0.05);

struct TokenStreamOptions {
  int64_t seq_len = 0;
  int64_t micro_batch = 0;
  int data_rank = 0;
  int data_world = 1;
  int64_t seed = 0;
  bool shuffle = true;
  bool contiguous = false;       // data/batch_order.h: micro-batch r of each global batch
  int64_t batches_per_step = 1;  // data/batch_order.h: an epoch of whole training steps
};

class TokenStream {
 public:
  // Throws std::invalid_argument naming the option when a size is not positive, data_rank is
  // outside [0, data_world), or the tokens do not fill one global batch.
  TokenStream(at::Tensor tokens, TokenStreamOptions options);

  // (inputs, targets), each [micro_batch, seq_len] int64 on the CPU; advances the position.
  std::pair<at::Tensor, at::Tensor> next();
  // Batch `index` of `epoch` without moving the position.
  std::pair<at::Tensor, at::Tensor> batch(int64_t epoch, int64_t index);
  // Window numbers of `epoch` in global order (the same on every rank).
  at::Tensor window_order(int64_t epoch) const;
  // The window numbers this rank reads for batch `index` of `epoch`.
  at::Tensor batch_windows(int64_t epoch, int64_t index);

  int64_t batches_per_epoch() const { return windows_.batches_per_epoch(); }
  int64_t epoch() const { return windows_.epoch(); }
  int64_t index() const { return windows_.index(); }
  // Restores a position (the next batch to produce); throws when it is out of range.
  void load_state(int64_t epoch, int64_t index) { windows_.load_state(epoch, index); }

 private:
  // (inputs, targets) of the windows numbered `windows`.
  std::pair<at::Tensor, at::Tensor> read_windows(const at::Tensor& windows) const;

  at::Tensor tokens_;
  TokenStreamOptions options_;
  BatchOrder windows_;
};

}  // namespace shardwise::data
