// World-size-independent checkpoint pieces, for LibTorch users and the Python trainer
// (python/shardwise/pieces.py).
//
// A piece is elements [start, start + values.numel()) of the flattened full tensor `name`: a
// replicated tensor is one piece starting at 0, an FSDP shard the piece its rank owns. Loading
// never asks how the saved pieces were cut: every rank reads the pieces of every saved rank and
// fill_from_pieces copies, into each slot it owns now (a writable 1-D view of elements
// [start, start + numel) of `name`), the overlap of every piece of that name. So a checkpoint of
// any world size or strategy loads into any other. (The ZeRO optimizer's own pieces in
// zero/zero_state.cpp follow the same rule.)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardwise::sharding {

struct TensorSlice {
  std::string name;
  int64_t start = 0;
  at::Tensor values;  // 1-D
};

// Copies the overlaps of `pieces` into `slots`. With `strict`, a slot element that no piece
// covers is an error (std::invalid_argument) naming the tensor and the range.
void fill_from_pieces(const std::vector<TensorSlice>& slots,
                      const std::vector<TensorSlice>& pieces,
                      bool strict = true);

}  // namespace shardwise::sharding
