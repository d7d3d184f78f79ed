// Where every element of a group of parameters lives when the group is sharded over `world_size`
// ranks, torch-free.
//
// Padding rule (FSDP2/DeepSpeed style, per parameter): parameter i, flattened, has `numel[i]`
// elements and is cut into `world_size` pieces of `chunk(i)` = ceil(numel[i] / world_size)
// elements rounded up to a multiple of `align` (so every piece starts on a 64-byte line for any
// element size); rank r holds elements [r * chunk(i), r * chunk(i) + valid(i, r)) of it, where
// valid(i, r) = clamp(numel[i] - r * chunk(i), 0, chunk(i)); the rest of its piece is padding,
// kept zero. A rank's shard is the concatenation of its pieces: piece i starts at `offset(i)` and
// the shard has `shard_numel()` = sum of chunk(i) elements on every rank.
//
// A communication buffer of the whole group is world_size shards laid end to end, rank-major:
// element k of parameter i sits at (k / chunk(i)) * shard_numel() + offset(i) + k % chunk(i).
// The all-gather output and the reduce-scatter input both use it, so rank r's block is exactly
// the shard it sends or receives.
#pragma once

#include <cstdint>
#include <vector>

namespace shardwise::sharding {

struct FlatLayoutOptions {
  std::vector<int64_t> numels;  // elements of each parameter, in group order
  int world_size = 1;
  int64_t align = 16;  // pieces are multiples of this many elements
};

class FlatLayout {
 public:
  explicit FlatLayout(const FlatLayoutOptions& options);

  int world_size() const { return world_size_; }
  int64_t num_params() const { return static_cast<int64_t>(numels_.size()); }
  int64_t numel(int64_t i) const { return numels_[i]; }
  int64_t chunk(int64_t i) const { return chunks_[i]; }
  int64_t offset(int64_t i) const { return offsets_[i]; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t total_numel() const { return shard_numel_ * world_size_; }
  int64_t param_numel() const { return param_numel_; }  // sum of numel: the unpadded size
  // First element of parameter i held by `rank`, and how many of its elements it holds.
  int64_t start(int64_t i, int rank) const;
  int64_t valid(int64_t i, int rank) const;
  // Elements of real data (not padding) in `rank`'s shard.
  int64_t valid_in_shard(int rank) const;

 private:
  int world_size_;
  std::vector<int64_t> numels_;
  std::vector<int64_t> chunks_;
  std::vector<int64_t> offsets_;
  int64_t shard_numel_ = 0;
  int64_t param_numel_ = 0;
};

}  // namespace shardwise::sharding
