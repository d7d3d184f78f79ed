// ExactSquareSum: integer bins of M^2 by exponent (see the header).
#include "distributed/exact_square_sum.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace shardwise::distributed {

void ExactSquareSum::add(const float* values, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    const uint32_t exponent = (bits >> 23) & 0xff;
    const uint64_t fraction = bits & 0x7fffff;
    if (exponent == 0xff) {
      (fraction ? nans_ : infinities_) += 1;
      continue;
    }
    const uint64_t mantissa = exponent ? (fraction | (uint64_t{1} << 23)) : fraction;
    bins_[exponent] += static_cast<unsigned __int128>(mantissa * mantissa);
  }
}

std::vector<int64_t> ExactSquareSum::limbs() const {
  std::vector<int64_t> out(kSize, 0);
  const unsigned __int128 mask = (static_cast<unsigned __int128>(1) << kLimbBits) - 1;
  for (int e = 0; e < kExponents; ++e) {
    for (int l = 0; l < kLimbs; ++l) {
      out[e * kLimbs + l] = static_cast<int64_t>((bins_[e] >> (kLimbBits * l)) & mask);
    }
  }
  out[kExponents * kLimbs] = nans_;
  out[kExponents * kLimbs + 1] = infinities_;
  return out;
}

double ExactSquareSum::value(const std::vector<int64_t>& limbs) {
  if (limbs.size() != static_cast<size_t>(kSize)) {
    throw std::invalid_argument("ExactSquareSum::value: " + std::to_string(limbs.size()) +
                                " limbs, expected " + std::to_string(kSize));
  }
  if (limbs[kExponents * kLimbs] > 0) return std::nan("");
  if (limbs[kExponents * kLimbs + 1] > 0) return INFINITY;
  double total = 0.0;
  for (int e = 0; e < kExponents; ++e) {
    // x = M * 2^(max(e, 1) - 150), so x^2 = M^2 * 2^(2 * (max(e, 1) - 150)).
    const int scale = 2 * ((e == 0 ? 1 : e) - 150);
    for (int l = 0; l < kLimbs; ++l) {
      const int64_t limb = limbs[e * kLimbs + l];
      if (limb != 0) total += std::ldexp(static_cast<double>(limb), scale + kLimbBits * l);
    }
  }
  return total;
}

}  // namespace shardwise::distributed
