#include "sharding/checkpoint_pieces.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <unordered_map>

namespace shardwise::sharding {

namespace {

// Refuses a piece whose range cannot be a slice of a tensor: no values, a negative start, or an
// end past int64 (a hostile or corrupt checkpoint; the overlap arithmetic below would overflow).
void check_piece(const TensorSlice& piece) {
  if (!piece.values.defined()) {
    throw std::invalid_argument("checkpoint: a piece of '" + piece.name + "' has no values");
  }
  const int64_t n = piece.values.numel();
  if (piece.start < 0 || piece.start > std::numeric_limits<int64_t>::max() - n) {
    throw std::invalid_argument("checkpoint: a piece of '" + piece.name + "' has start " +
                                std::to_string(piece.start) + " and " + std::to_string(n) +
                                " values: not a range of a tensor (corrupt checkpoint?)");
  }
}

// The number of elements in the union of half-open ranges (overlaps counted once: replicated
// tensors are saved by every rank, and a duplicated piece must not hide a missing one).
int64_t union_length(std::vector<std::pair<int64_t, int64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  int64_t length = 0, end = std::numeric_limits<int64_t>::min();
  for (const auto& [lo, hi] : ranges) {
    if (hi <= end) continue;
    length += hi - std::max(lo, end);
    end = hi;
  }
  return length;
}

}  // namespace

void fill_from_pieces(const std::vector<TensorSlice>& slots,
                      const std::vector<TensorSlice>& pieces,
                      bool strict) {
  std::unordered_map<std::string, std::vector<const TensorSlice*>> by_name;
  for (const TensorSlice& piece : pieces) {
    check_piece(piece);
    by_name[piece.name].push_back(&piece);
  }
  c10::NoGradGuard no_grad;
  for (const TensorSlice& slot : slots) {
    const int64_t lo = slot.start, hi = slot.start + slot.values.numel();
    std::vector<std::pair<int64_t, int64_t>> covered;
    const auto found = by_name.find(slot.name);
    for (const TensorSlice* piece :
         found == by_name.end() ? decltype(found->second){} : found->second) {
      const int64_t p_lo = piece->start, p_hi = piece->start + piece->values.numel();
      const int64_t a = std::max(lo, p_lo), b = std::min(hi, p_hi);
      if (a >= b) continue;
      slot.values.narrow(0, a - lo, b - a)
          .copy_(piece->values.reshape(-1).narrow(0, a - p_lo, b - a));
      covered.emplace_back(a, b);
    }
    const int64_t count = union_length(std::move(covered));
    if (strict && count < hi - lo) {
      throw std::invalid_argument(
          "checkpoint: the saved pieces cover only " + std::to_string(count) + " of the " +
          std::to_string(hi - lo) + " elements [" + std::to_string(lo) + ", " + std::to_string(hi) +
          ") of '" + slot.name +
          "'; the checkpoint is of another model (compare its model.* config with this run's) "
          "or is missing a rank's file");
    }
  }
}

}  // namespace shardwise::sharding
