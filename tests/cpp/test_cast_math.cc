// Exhaustive checks of the per-element conversions in cast_math.h (the functions the CUDA kernels
// run), each against a reference derived independently of it:
// - float32 -> bfloat16 against rounding by value in double arithmetic;
// - float32 -> float16 against the compiler's _Float16 conversion (IEEE round to nearest even, in
//   software, so on every 61st bit pattern to keep it fast; test_cast_cpu.cc compares all 2^32
//   with the vcvtps2ph instruction on CPUs that have AVX-512);
// - the 16-bit -> float32 widenings against value arithmetic;
// over every input bit pattern (unless said otherwise), split across threads.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "precision/cast_math.h"

namespace sp = shardwise::precision;

namespace {

// Runs check(first, last) on [0, 2^32) split across hardware threads; returns the failure count.
uint64_t for_all_float_bits(const std::function<uint64_t(uint64_t, uint64_t)>& check) {
  const unsigned workers = std::max(2u, std::thread::hardware_concurrency());
  const uint64_t total = uint64_t{1} << 32;
  std::atomic<uint64_t> failures{0};
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) {
    threads.emplace_back(
        [&, w] { failures += check(total * w / workers, total * (w + 1) / workers); });
  }
  for (auto& t : threads) {
    t.join();
  }
  return failures.load();
}

double bf16_value(uint16_t bits) {
  return static_cast<double>(sp::bits_float(sp::bf16_to_float_bits(bits)));
}

// Rounds by value: the two bf16 neighbours of x are the truncation and the next one away from
// zero; pick the nearer, and on a tie the one with an even last bit.
uint16_t reference_bf16(uint32_t bits) {
  const float x = sp::bits_float(bits);
  if (std::isnan(x)) {
    return sp::kBf16Nan;
  }
  if (std::isinf(x)) {
    return static_cast<uint16_t>(bits >> 16);
  }
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);  // may become Inf: still the next value
  const double distance_down = std::fabs(static_cast<double>(x) - bf16_value(down));
  const double up_value =
      (up & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), x) : bf16_value(up);
  const double distance_up = std::fabs(up_value - static_cast<double>(x));
  if (distance_down != distance_up) {
    return distance_down < distance_up ? down : up;
  }
  return (down & 1u) == 0 ? down : up;
}

}  // namespace

TEST(CastMath, FloatToBf16MatchesRoundingByValueOnAllFloats) {
  const uint64_t failures = for_all_float_bits([](uint64_t first, uint64_t last) {
    uint64_t bad = 0;
    for (uint64_t b = first; b < last; ++b) {
      const uint32_t bits = static_cast<uint32_t>(b);
      bad += sp::float_to_bf16_bits(bits) != reference_bf16(bits);
    }
    return bad;
  });
  EXPECT_EQ(failures, 0u);
}

TEST(CastMath, FloatToHalfMatchesCompilerConversion) {
  const uint64_t failures = for_all_float_bits([](uint64_t first, uint64_t last) {
    uint64_t bad = 0;
    for (uint64_t b = first; b < last; b += 61) {
      const uint32_t bits = static_cast<uint32_t>(b);
      const uint16_t ours = sp::float_to_half_bits(bits);
      uint16_t expected;
      if (sp::is_nan_bits(bits)) {  // quiet NaN, sign and top 10 payload bits kept
        expected =
            static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7e00u | ((bits >> 13) & 0x3ffu));
      } else {
        const _Float16 half = static_cast<_Float16>(sp::bits_float(bits));
        std::memcpy(&expected, &half, sizeof(expected));
      }
      bad += ours != expected;
    }
    return bad;
  });
  EXPECT_EQ(failures, 0u);
}

TEST(CastMath, HalfToFloatIsExactOnAllHalves) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t half_bits = static_cast<uint16_t>(h);
    const float widened = sp::bits_float(sp::half_to_float_bits(half_bits));
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    if (exponent == 0x1f && mantissa != 0) {
      EXPECT_TRUE(std::isnan(widened)) << h;
      EXPECT_EQ(sp::float_bits(widened), (h & 0x8000u) << 16 | 0x7fc00000u | mantissa << 13) << h;
      continue;
    }
    const double value = exponent == 0x1f ? sign * INFINITY
                         : exponent == 0  ? sign * std::ldexp(mantissa, -24)
                                          : sign * std::ldexp(1024 + mantissa, int(exponent) - 25);
    EXPECT_EQ(static_cast<double>(widened), value) << h;
    EXPECT_EQ(std::signbit(widened), (h & 0x8000u) != 0) << h;
    // Round trip: every non-NaN half survives float32 and back.
    EXPECT_EQ(sp::float_to_half_bits(sp::half_to_float_bits(half_bits)), half_bits) << h;
  }
}

TEST(CastMath, Bf16ToFloatIsExactAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    EXPECT_EQ(sp::bf16_to_float_bits(bits), h << 16);
    if (!sp::is_nan_bits(h << 16)) {
      EXPECT_EQ(sp::float_to_bf16_bits(sp::bf16_to_float_bits(bits)), bits) << h;
    }
  }
}

TEST(CastMath, EdgeValues) {
  EXPECT_EQ(sp::float_to_bf16_bits(0x3f808000u), 0x3f80u);  // tie, even stays
  EXPECT_EQ(sp::float_to_bf16_bits(0x3f818000u), 0x3f82u);  // tie, odd rounds up
  EXPECT_EQ(sp::float_to_bf16_bits(0x7f7fffffu), 0x7f80u);  // FLT_MAX overflows to Inf
  EXPECT_EQ(sp::float_to_bf16_bits(0x00000001u), 0x0000u);  // smallest denormal to zero
  EXPECT_EQ(sp::float_to_bf16_bits(0x80008000u), 0x8000u);  // tie to even, negative zero
  EXPECT_EQ(sp::float_to_half_bits(sp::float_bits(65504.0f)), 0x7bffu);
  EXPECT_EQ(sp::float_to_half_bits(sp::float_bits(65519.996f)), 0x7bffu);
  EXPECT_EQ(sp::float_to_half_bits(sp::float_bits(65520.0f)), 0x7c00u);
  EXPECT_EQ(sp::float_to_half_bits(sp::float_bits(std::ldexp(1.0f, -24))), 0x0001u);
  EXPECT_EQ(sp::float_to_half_bits(sp::float_bits(std::ldexp(1.0f, -25))), 0x0000u);
  EXPECT_EQ(sp::float_to_half_bits(sp::float_bits(-std::ldexp(1.5f, -25))), 0x8001u);
}

TEST(CastMath, StochasticRoundingPicksANeighbourAndIsUnbiased) {
  // x = 1 + 0.3 ulp(bf16): rounds up with probability 0.3.
  const uint32_t bits = 0x3f800000u + static_cast<uint32_t>(0.3 * 65536);
  const double x = sp::bits_float(bits);
  const uint32_t key = sp::stochastic_key(1234, 0);
  const int draws = 1 << 20;
  double sum = 0;
  int ups = 0;
  for (int i = 0; i < draws; ++i) {
    const uint16_t r = sp::float_to_bf16_stochastic_bits(bits, sp::stochastic_noise(key, i));
    ASSERT_TRUE(r == 0x3f80u || r == 0x3f81u);
    ups += r == 0x3f81u;
    sum += bf16_value(r);
  }
  // Binomial(2^20, p): the standard deviation of the up-fraction is sqrt(p(1-p)/n) ~ 4.5e-4;
  // a 6-sigma bound cannot fail by chance in practice.
  const double p = (bits & 0xffffu) / 65536.0;
  EXPECT_NEAR(static_cast<double>(ups) / draws, p, 6 * std::sqrt(p * (1 - p) / draws));
  EXPECT_NEAR(sum / draws, x, 6 * std::sqrt(p * (1 - p) / draws) * std::ldexp(1.0, -7));
  EXPECT_EQ(sp::float_to_bf16_stochastic_bits(0x7f800000u, 0xffffu), 0x7f80u);
  EXPECT_EQ(sp::float_to_bf16_stochastic_bits(0x7fc00001u, 0u), sp::kBf16Nan);
  EXPECT_EQ(sp::float_to_bf16_stochastic_bits(0x3f800000u, 0xffffu), 0x3f80u);  // exact stays
}

TEST(CastMath, StochasticNoiseDependsOnSeedAndCounter) {
  EXPECT_NE(sp::stochastic_key(1, 0), sp::stochastic_key(2, 0));
  EXPECT_NE(sp::stochastic_key(1, 0), sp::stochastic_key(1, 1));
  EXPECT_NE(sp::stochastic_key(uint64_t{1} << 32, 0), sp::stochastic_key(0, 0));
  const uint32_t key = sp::stochastic_key(7, 0);
  // The 16-bit noise is close to uniform: each of 16 buckets gets 1/16 of 2^20 draws.
  std::vector<int> buckets(16, 0);
  for (uint32_t i = 0; i < (1u << 20); ++i) {
    ++buckets[sp::stochastic_noise(key, i) >> 12];
  }
  for (int count : buckets) {
    EXPECT_NEAR(count, 65536, 6 * 250);  // sd = sqrt(2^20 * 1/16 * 15/16) ~ 248
  }
}
