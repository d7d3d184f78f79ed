#include "sharding/flat_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace shardwise::sharding {

FlatLayout::FlatLayout(const FlatLayoutOptions& options)
    : world_size_(options.world_size), numels_(options.numels) {
  if (world_size_ < 1) {
    throw std::invalid_argument("FlatLayout: world_size must be >= 1, got " +
                                std::to_string(world_size_));
  }
  if (options.align < 1) {
    throw std::invalid_argument("FlatLayout: align must be >= 1, got " +
                                std::to_string(options.align));
  }
  chunks_.reserve(numels_.size());
  offsets_.reserve(numels_.size());
  for (size_t i = 0; i < numels_.size(); ++i) {
    if (numels_[i] < 0) {
      throw std::invalid_argument("FlatLayout: numels[" + std::to_string(i) + "] is negative");
    }
    const int64_t chunk = (numels_[i] + world_size_ - 1) / world_size_;
    offsets_.push_back(shard_numel_);
    chunks_.push_back((chunk + options.align - 1) / options.align * options.align);
    shard_numel_ += chunks_.back();
    param_numel_ += numels_[i];
  }
}

int64_t FlatLayout::start(int64_t i, int rank) const { return rank * chunks_[i]; }

int64_t FlatLayout::valid(int64_t i, int rank) const {
  return std::clamp<int64_t>(numels_[i] - rank * chunks_[i], 0, chunks_[i]);
}

int64_t FlatLayout::valid_in_shard(int rank) const {
  int64_t total = 0;
  for (int64_t i = 0; i < num_params(); ++i) total += valid(i, rank);
  return total;
}

}  // namespace shardwise::sharding
