// ExactSquareSum: the sum of squares does not depend on how the values are split (as FSDP's
// shards split a gradient differently at each world size), and it is the true sum to double
// precision, subnormals and the largest floats included; NaN and infinity propagate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "distributed/exact_square_sum.h"

namespace shardwise::distributed {
namespace {

std::vector<float> spread(size_t count) {  // +-(1 + f) * 2^e, e in [-140, 60]
  std::vector<float> v(count);
  uint64_t state = 12345;
  for (size_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int e = static_cast<int>((state >> 33) % 201) - 140;
    const float f = static_cast<float>((state >> 12) & 0xfffff) / float(1 << 20);
    v[i] = std::ldexp((state >> 63) ? -(1.0f + f) : 1.0f + f, e);
  }
  return v;
}

double split_value(const std::vector<float>& v, size_t parts) {
  std::vector<int64_t> summed(ExactSquareSum::kSize, 0);
  for (size_t p = 0; p < parts; ++p) {  // uneven pieces, as shards of several parameters
    const size_t begin = v.size() * p * p / (parts * parts);
    const size_t end = v.size() * (p + 1) * (p + 1) / (parts * parts);
    ExactSquareSum part;
    part.add(v.data() + begin, end - begin);
    const auto limbs = part.limbs();
    for (size_t i = 0; i < limbs.size(); ++i) summed[i] += limbs[i];
  }
  return ExactSquareSum::value(summed);
}

TEST(ExactSquareSum, TheSplitDoesNotChangeABit) {
  const auto v = spread(100003);
  const double whole = split_value(v, 1);
  for (size_t parts : {2, 3, 4, 8, 64}) {
    const double split = split_value(v, parts);
    EXPECT_EQ(std::memcmp(&split, &whole, sizeof(double)), 0) << parts << " parts";
  }
  // A float64 sum in two orders differs (so the inputs would show a split-dependent sum).
  double forward = 0, backward = 0;
  for (float x : v) forward += static_cast<double>(x) * x;
  for (size_t i = v.size(); i-- > 0;) backward += static_cast<double>(v[i]) * v[i];
  EXPECT_NE(forward, backward);
  EXPECT_NEAR(whole, forward, std::abs(forward) * 1e-13);
}

TEST(ExactSquareSum, SubnormalsAndTheLargestFloats) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> v{tiny, -3 * tiny, big, 0.0f, -0.0f};
  ExactSquareSum sum;
  sum.add(v.data(), v.size());
  const double expected = 10.0 * tiny * static_cast<double>(tiny) + static_cast<double>(big) * big;
  EXPECT_EQ(ExactSquareSum::value(sum.limbs()), expected);
  ExactSquareSum small;
  small.add(v.data(), 2);
  EXPECT_EQ(ExactSquareSum::value(small.limbs()), 10.0 * tiny * static_cast<double>(tiny));
}

TEST(ExactSquareSum, NanAndInfinityPropagate) {
  const std::vector<float> v{1.0f, std::numeric_limits<float>::infinity()};
  ExactSquareSum sum;
  sum.add(v.data(), v.size());
  EXPECT_TRUE(std::isinf(ExactSquareSum::value(sum.limbs())));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  sum.add(&nan, 1);
  EXPECT_TRUE(std::isnan(ExactSquareSum::value(sum.limbs())));
  EXPECT_THROW(ExactSquareSum::value({1, 2}), std::invalid_argument);
}

}  // namespace
}  // namespace shardwise::distributed
