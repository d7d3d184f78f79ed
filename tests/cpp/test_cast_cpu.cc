// The CPU cast kernels of every instruction set this machine has, checked bit-exact against the
// per-element functions of cast_math.h on all 2^32 float32 and all 2^16 16-bit patterns, plus the
// non-finite flag, odd lengths (masked tails) and the stochastic kernel's counter runs.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "precision/cast_kernels.h"
#include "precision/cast_math.h"

namespace sp = shardwise::precision;
using shardwise::CpuIsa;

namespace {

std::vector<CpuIsa> available_isas() {
  std::vector<CpuIsa> isas;
  for (int i = 0; i <= static_cast<int>(shardwise::detected_cpu_isa()); ++i) {
    isas.push_back(static_cast<CpuIsa>(i));
  }
  return isas;
}

std::string isa_param_name(const testing::TestParamInfo<CpuIsa>& info) {
  return shardwise::cpu_isa_name(info.param);
}

class CastCpu : public testing::TestWithParam<CpuIsa> {};

// Casts every float32 bit pattern in chunks and compares with `scalar`.
template <typename Scalar>
void expect_all_floats_match(sp::Format dst, CpuIsa isa, Scalar scalar) {
  constexpr uint64_t kChunk = uint64_t{1} << 22;
  std::vector<uint32_t> in(kChunk);
  std::vector<uint16_t> out(kChunk);
  uint64_t mismatches = 0;
  for (uint64_t start = 0; start < (uint64_t{1} << 32); start += kChunk) {
    std::iota(in.begin(), in.end(), static_cast<uint32_t>(start));
    sp::cast_cpu(in.data(), out.data(), kChunk, {sp::Format::kFloat32, dst, false}, isa);
    for (uint64_t i = 0; i < kChunk; ++i) {
      mismatches += out[i] != scalar(in[i]);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

}  // namespace

TEST_P(CastCpu, FloatToBf16MatchesScalarOnAllFloats) {
  expect_all_floats_match(sp::Format::kBFloat16, GetParam(), sp::float_to_bf16_bits);
}

TEST_P(CastCpu, FloatToHalfMatchesScalarOnAllFloats) {
  expect_all_floats_match(sp::Format::kFloat16, GetParam(), sp::float_to_half_bits);
}

TEST_P(CastCpu, WideningMatchesScalarOnAll16BitPatterns) {
  std::vector<uint16_t> in(0x10000);
  std::iota(in.begin(), in.end(), uint16_t{0});
  std::vector<uint32_t> out(in.size());
  sp::cast_cpu(in.data(), out.data(), in.size(), {sp::Format::kBFloat16, sp::Format::kFloat32},
               GetParam());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], sp::bf16_to_float_bits(in[i])) << i;
  }
  sp::cast_cpu(in.data(), out.data(), in.size(), {sp::Format::kFloat16, sp::Format::kFloat32},
               GetParam());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(out[i], sp::half_to_float_bits(in[i])) << i;
  }
}

TEST_P(CastCpu, NonfiniteFlagAtEveryPositionAndLength) {
  // For each length 1..40 (covering masked tails) and each position, one Inf/NaN/overflowing
  // element must set the flag, and the flag must stay clear without one; the element past the
  // end is poisoned so a kernel reading beyond `numel` would report it.
  const uint32_t poisons[] = {0x7f800000u, 0xffc00001u, sp::float_bits(1e30f)};
  for (int64_t n = 1; n <= 40; ++n) {
    std::vector<float> in(n + 1, 1.5f);
    in[n] = sp::bits_float(0x7f800000u);
    std::vector<uint16_t> out(n + 1);
    for (sp::Format dst : {sp::Format::kBFloat16, sp::Format::kFloat16}) {
      const sp::CastOptions options{sp::Format::kFloat32, dst, true};
      ASSERT_FALSE(sp::cast_cpu(in.data(), out.data(), n, options, GetParam())) << n;
      for (int64_t pos = 0; pos < n; ++pos) {
        for (uint32_t poison : poisons) {
          const bool overflows_only_half = poison == sp::float_bits(1e30f);
          in[pos] = sp::bits_float(poison);
          const bool flagged = sp::cast_cpu(in.data(), out.data(), n, options, GetParam());
          EXPECT_EQ(flagged, dst == sp::Format::kFloat16 || !overflows_only_half) << n << pos;
          in[pos] = 1.5f;
        }
      }
    }
    std::vector<uint16_t> narrow(n + 1, 0x3f80u);
    narrow[n] = 0x7f80u;
    std::vector<float> wide(n + 1);
    const sp::CastOptions widen{sp::Format::kBFloat16, sp::Format::kFloat32, true};
    EXPECT_FALSE(sp::cast_cpu(narrow.data(), wide.data(), n, widen, GetParam()));
    narrow[n - 1] = 0xff81u;
    EXPECT_TRUE(sp::cast_cpu(narrow.data(), wide.data(), n, widen, GetParam()));
  }
}

TEST_P(CastCpu, StochasticMatchesScalarAcrossCounterRuns) {
  // 1000 elements starting 300 before a 2^32 counter boundary exercise two keys and the tails.
  std::vector<float> in(1000);
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = sp::bits_float(0x3f800000u + static_cast<uint32_t>(i * 2654435761u % 0x7fffffu));
  }
  in[10] = sp::bits_float(0x7fc00000u);
  in[11] = sp::bits_float(0xff800000u);
  for (uint64_t base : {uint64_t{0}, (uint64_t{1} << 32) - 300, uint64_t{5} << 40}) {
    const sp::StochasticOptions options{99, base};
    std::vector<uint16_t> out(in.size());
    sp::cast_float_to_bf16_stochastic_cpu(in.data(), out.data(), in.size(), options, GetParam());
    for (size_t i = 0; i < in.size(); ++i) {
      const uint64_t counter = base + i;
      const uint32_t noise = sp::stochastic_noise(sp::stochastic_key(99, counter >> 32),
                                                  static_cast<uint32_t>(counter));
      ASSERT_EQ(out[i], sp::float_to_bf16_stochastic_bits(sp::float_bits(in[i]), noise)) << i;
    }
    // Casting in two pieces with matching counter bases gives the same bits as one call.
    std::vector<uint16_t> pieces(in.size());
    sp::cast_float_to_bf16_stochastic_cpu(in.data(), pieces.data(), 333, options, GetParam());
    sp::cast_float_to_bf16_stochastic_cpu(in.data() + 333, pieces.data() + 333, in.size() - 333,
                                          {99, base + 333}, GetParam());
    EXPECT_EQ(pieces, out);
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, CastCpu, testing::ValuesIn(available_isas()), isa_param_name);

TEST(CpuFeatures, ParsesNamesAndRejectsUnknownOnes) {
  EXPECT_EQ(shardwise::parse_cpu_isa("scalar"), CpuIsa::kScalar);
  EXPECT_EQ(shardwise::parse_cpu_isa("avx512_bf16"), CpuIsa::kAvx512Bf16);
  try {
    shardwise::parse_cpu_isa("sse9");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("valid: scalar, avx512, avx512_bf16"), std::string::npos);
  }
}

TEST(CpuFeatures, OverrideLowersTheActiveIsaAndClears) {
  shardwise::set_cpu_isa(CpuIsa::kScalar);
  EXPECT_EQ(shardwise::active_cpu_isa(), CpuIsa::kScalar);
  shardwise::set_cpu_isa(std::nullopt);
  if (shardwise::detected_cpu_isa() != CpuIsa::kAvx512Bf16) {
    EXPECT_THROW(shardwise::set_cpu_isa(CpuIsa::kAvx512Bf16), std::invalid_argument);
  }
}

TEST(CastCpuErrors, RejectsUnsupportedConversions) {
  float x = 1.0f, y = 0.0f;
  EXPECT_THROW(
      sp::cast_cpu(&x, &y, 1, {sp::Format::kFloat32, sp::Format::kFloat32}, CpuIsa::kScalar),
      std::invalid_argument);
}
