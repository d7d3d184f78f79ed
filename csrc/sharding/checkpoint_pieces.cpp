#include "sharding/checkpoint_pieces.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace shardwise::sharding {

void fill_from_pieces(const std::vector<TensorSlice>& slots,
                      const std::vector<TensorSlice>& pieces,
                      bool strict) {
  std::unordered_map<std::string, std::vector<const TensorSlice*>> by_name;
  for (const TensorSlice& piece : pieces) by_name[piece.name].push_back(&piece);
  c10::NoGradGuard no_grad;
  for (const TensorSlice& slot : slots) {
    const int64_t lo = slot.start, hi = slot.start + slot.values.numel();
    int64_t covered = 0;
    const auto found = by_name.find(slot.name);
    for (const TensorSlice* piece :
         found == by_name.end() ? decltype(found->second){} : found->second) {
      const int64_t p_lo = piece->start, p_hi = piece->start + piece->values.numel();
      const int64_t a = std::max(lo, p_lo), b = std::min(hi, p_hi);
      if (a >= b) continue;
      slot.values.narrow(0, a - lo, b - a)
          .copy_(piece->values.reshape(-1).narrow(0, a - p_lo, b - a));
      covered += b - a;
    }
    if (strict && covered < hi - lo) {
      throw std::invalid_argument(
          "checkpoint: the saved pieces cover only " + std::to_string(covered) + " of the " +
          std::to_string(hi - lo) + " elements [" + std::to_string(lo) + ", " + std::to_string(hi) +
          ") of '" + slot.name +
          "'; the checkpoint is of another model (compare its model.* config with this run's) "
          "or is missing a rank's file");
    }
  }
}

}  // namespace shardwise::sharding
