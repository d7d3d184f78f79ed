// Token files (data/token_file.h) as tensors, for LibTorch programs and the Python trainer.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>

#include "data/token_file.h"

namespace shardwise::data {

// The tokens of a .bin (of `bin_type`) or .npy file as a 1-D CPU tensor of the file's dtype
// (kUInt16 for nanoGPT's files), memory-mapped read-only: nothing is read until used. Throws
// std::invalid_argument naming the path, as describe_token_file does.
at::Tensor read_token_file(const std::string& path, TokenType bin_type = TokenType::kUInt16);

// Token ids as int64 (unsigned types widened without sign extension).
at::Tensor token_ids(const at::Tensor& tokens);

// The same bytes as a signed type index_select supports (uint16 -> int16, ...); token_ids of a
// gathered view is what token_ids of the original would give.
at::Tensor signed_view(const at::Tensor& tokens);

// (smallest, largest) id in `tokens`, read in chunks, so a vocabulary can be checked against a
// memory-mapped file before training.
std::pair<int64_t, int64_t> token_range(const at::Tensor& tokens);

}  // namespace shardwise::data
