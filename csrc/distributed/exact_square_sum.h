// The exact sum of squares of float32 values, for a gradient norm that does not depend on how
// the gradients are split over ranks (deterministic training: FSDP's shard boundaries move with
// the world size, and a floating-point sum of the shards' partial sums would too).
//
// A finite float32 x is M * 2^e with an integer M < 2^24 (e = E - 150 for the biased exponent
// E = 1..254, M with its implicit bit; e = -149 and M the fraction for subnormals), so
// x^2 = M^2 * 2^(2e) with M^2 < 2^48 an exact integer. `bins[E]` adds up the M^2 of every value
// with exponent field E as a 128-bit integer: exact, in any order. For the exchange between ranks
// each bin is cut into three 42-bit limbs (int64), which an integer all-reduce adds exactly for
// up to 2^21 ranks; NaN and infinity are counted in two more. `value` turns the summed limbs into
// a double in one fixed order, so every rank, at every world size, gets the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardwise::distributed {

class ExactSquareSum {
 public:
  static constexpr int kExponents = 255;  // biased exponents 0 (subnormal) .. 254
  static constexpr int kLimbs = 3;
  static constexpr int kLimbBits = 42;
  // kExponents * kLimbs limbs, then the NaN count and the infinity count.
  static constexpr int kSize = kExponents * kLimbs + 2;

  void add(const float* values, size_t count);
  // The limbs to add over the ranks (int64 SUM).
  std::vector<int64_t> limbs() const;
  // The sum of squares the summed limbs stand for: NaN when any value was NaN, infinity when
  // any was infinite; else their exact total rounded in one fixed order.
  static double value(const std::vector<int64_t>& limbs);

 private:
  unsigned __int128 bins_[kExponents] = {};
  int64_t nans_ = 0;
  int64_t infinities_ = 0;
};

}  // namespace shardwise::distributed
