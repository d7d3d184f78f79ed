// The fused optimizer steps without torch: the AVX-512 loops bit-identical to the scalar loops
// (optim_math.h per element) on random arrays of odd lengths, for every gradient format, with and
// without the low-precision copy (itself bit-equal to rounding the float32 result with
// cast_math.h); and one AdamW element against a double-precision reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/cpu_features.h"
#include "optim/fused_optim.h"
#include "precision/cast_math.h"

namespace so = shardwise::optim;
namespace sp = shardwise::precision;
using shardwise::CpuIsa;

namespace {

const int64_t kLengths[] = {0, 1, 15, 16, 17, 1003};
const sp::Format kFormats[] = {sp::Format::kFloat32, sp::Format::kBFloat16, sp::Format::kFloat16};

// Random float32 values of magnitudes ~1e-4..1e2, plus zeros and a few exact extremes.
std::vector<float> random_floats(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-4, 2);
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) {
    values[i] = (i % 97 == 5) ? 0.0f : scale * normal(rng) * std::pow(10.0f, exponent(rng));
  }
  return values;
}

// The gradient stored in `format` (16-bit ones rounded with cast_math.h).
std::vector<uint8_t> encode(const std::vector<float>& values, sp::Format format) {
  const size_t bytes = format == sp::Format::kFloat32 ? 4 : 2;
  std::vector<uint8_t> out(values.size() * bytes + 1);
  for (size_t i = 0; i < values.size(); ++i) {
    if (format == sp::Format::kFloat32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint32_t bits = sp::float_bits(values[i]);
      const uint16_t h = format == sp::Format::kBFloat16 ? sp::float_to_bf16_bits(bits)
                                                         : sp::float_to_half_bits(bits);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The state of one AdamW run: three steps from random values, all in one struct.
struct AdamWRun {
  std::vector<float> param, exp_avg, exp_avg_sq;
  std::vector<uint16_t> low;

  AdamWRun(int64_t n, bool with_low)
      : param(random_floats(n, 1)),
        exp_avg(random_floats(n, 2, 0.1f)),
        exp_avg_sq(n),
        low(with_low ? n : 0) {
    const std::vector<float> values = random_floats(n, 3);
    for (int64_t i = 0; i < n; ++i) exp_avg_sq[i] = std::fabs(values[i]) * 0.01f;
  }

  void steps(const std::vector<uint8_t>& grad,
             sp::Format format,
             sp::Format low_format,
             double grad_scale,
             CpuIsa isa) {
    for (int64_t step = 1; step <= 3; ++step) {
      so::AdamWOptions options;
      options.step = step;
      options.grad_scale = grad_scale;
      options.weight_decay = 0.1;
      so::AdamWSpan span{param.data(),
                         grad.data(),
                         format,
                         exp_avg.data(),
                         exp_avg_sq.data(),
                         low.empty() ? nullptr : low.data(),
                         low_format,
                         static_cast<int64_t>(param.size())};
      so::fused_adamw_cpu(&span, 1, so::adamw_scalars(options), isa);
    }
  }
};

void expect_low_precision_is_rounded_param(const std::vector<float>& param,
                                           const std::vector<uint16_t>& low,
                                           sp::Format format) {
  for (size_t i = 0; i < low.size(); ++i) {
    const uint32_t bits = sp::float_bits(param[i]);
    const uint16_t expected = format == sp::Format::kFloat16 ? sp::float_to_half_bits(bits)
                                                             : sp::float_to_bf16_bits(bits);
    ASSERT_EQ(low[i], expected) << "element " << i;
  }
}

}  // namespace

TEST(OptimMath, AdamWAvx512MatchesScalarBitForBit) {
  if (shardwise::detected_cpu_isa() < CpuIsa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (int64_t n : kLengths) {
    for (sp::Format grad_format : kFormats) {
      for (sp::Format low_format : {sp::Format::kFloat32, sp::Format::kBFloat16,
                                    sp::Format::kFloat16}) {  // kFloat32: no copy
        for (double grad_scale : {1.0, 0.37}) {
          const auto grad = encode(random_floats(n, 7), grad_format);
          const bool with_low = low_format != sp::Format::kFloat32;
          AdamWRun scalar(n, with_low), vector(n, with_low);
          scalar.steps(grad, grad_format, low_format, grad_scale, CpuIsa::kScalar);
          vector.steps(grad, grad_format, low_format, grad_scale, CpuIsa::kAvx512);
          SCOPED_TRACE(testing::Message() << "n=" << n << " grad=" << sp::format_name(grad_format)
                                          << " low=" << with_low << " scale=" << grad_scale);
          EXPECT_TRUE(same_bits(scalar.param, vector.param));
          EXPECT_TRUE(same_bits(scalar.exp_avg, vector.exp_avg));
          EXPECT_TRUE(same_bits(scalar.exp_avg_sq, vector.exp_avg_sq));
          EXPECT_EQ(scalar.low, vector.low);
          if (with_low) expect_low_precision_is_rounded_param(vector.param, vector.low, low_format);
        }
      }
    }
  }
}

TEST(OptimMath, SgdAvx512MatchesScalarBitForBit) {
  if (shardwise::detected_cpu_isa() < CpuIsa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  const Case cases[] = {{0.0, 0.0, 0.0, false},
                        {0.9, 0.0, 1e-2, false},
                        {0.9, 0.0, 1e-2, true},
                        {0.8, 0.3, 0.0, false}};
  for (int64_t n : kLengths) {
    for (sp::Format grad_format : kFormats) {
      for (const Case& c : cases) {
        const auto grad = encode(random_floats(n, 11), grad_format);
        std::vector<float> params[2] = {random_floats(n, 1), random_floats(n, 1)};
        std::vector<float> buffers[2] = {std::vector<float>(n), std::vector<float>(n)};
        std::vector<uint16_t> lows[2] = {std::vector<uint16_t>(n), std::vector<uint16_t>(n)};
        const CpuIsa isas[2] = {CpuIsa::kScalar, CpuIsa::kAvx512};
        for (int k = 0; k < 2; ++k) {
          for (int step = 0; step < 3; ++step) {
            so::SgdOptions options{0.05,       c.momentum, c.dampening,          c.weight_decay,
                                   c.nesterov, step == 0,  step == 2 ? 0.5 : 1.0};
            so::SgdSpan span{params[k].data(),
                             grad.data(),
                             grad_format,
                             c.momentum != 0.0 ? buffers[k].data() : nullptr,
                             lows[k].data(),
                             sp::Format::kBFloat16,
                             n};
            so::fused_sgd_cpu(&span, 1, so::sgd_scalars(options), isas[k]);
          }
        }
        SCOPED_TRACE(testing::Message()
                     << "n=" << n << " grad=" << sp::format_name(grad_format)
                     << " momentum=" << c.momentum << " nesterov=" << c.nesterov);
        EXPECT_TRUE(same_bits(params[0], params[1]));
        EXPECT_TRUE(same_bits(buffers[0], buffers[1]));
        EXPECT_EQ(lows[0], lows[1]);
        expect_low_precision_is_rounded_param(params[1], lows[1], sp::Format::kBFloat16);
      }
    }
  }
}

// One AdamW element against the same update in double precision. Each float32 operation rounds
// with relative error <= u = 2^-24; the update is a chain of about ten of them, and for the step
// sizes here the param update is small compared with param, so param's error is dominated by one
// rounding of param itself and of the decay (3u |param|), the update's relative error (<= ~10
// roundings: 12u |update|), and exp_avg's absolute error (<= 4u (|exp_avg| + |grad|), which is
// large relative to exp_avg when grad - exp_avg cancels) carried by step_size / denom.
TEST(OptimMath, AdamWElementMatchesDoubleReference) {
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0.01;
  const double u = std::ldexp(1.0, -24);
  std::mt19937 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t step = 1; step <= 50; step += 7) {
    so::AdamWOptions options{lr, beta1, beta2, eps, wd, step, 1.0};
    const so::AdamWScalars s = so::adamw_scalars(options);
    for (int trial = 0; trial < 2000; ++trial) {
      float param = static_cast<float>(normal(rng));
      float m = static_cast<float>(0.1 * normal(rng));
      float v = static_cast<float>(0.01 * std::fabs(normal(rng)));
      const float grad = static_cast<float>(normal(rng));
      double pd = param, md = m, vd = v;
      pd *= 1.0 - lr * wd;
      md = md + (1.0 - beta1) * (grad - md);
      vd = vd * beta2 + (1.0 - beta2) * grad * grad;
      const double denom = std::sqrt(vd) / std::sqrt(1.0 - std::pow(beta2, step)) + eps;
      const double update = -(lr / (1.0 - std::pow(beta1, step))) * md / denom;
      pd += update;
      so::adamw_element(param, m, v, grad, s);
      const double carried =
          4 * u * (std::fabs(md) + std::fabs(grad)) * (lr / (1.0 - std::pow(beta1, step))) / denom;
      ASSERT_LE(std::fabs(param - pd), 3 * u * std::fabs(pd) + 12 * u * std::fabs(update) + carried)
          << "step " << step << " trial " << trial;
      ASSERT_LE(std::fabs(m - md), 4 * u * (std::fabs(md) + std::fabs(grad)));
      ASSERT_LE(std::fabs(v - vd), 4 * u * vd);
    }
  }
}

TEST(OptimMath, ScalarsFollowTorch) {
  so::AdamWOptions options;
  options.step = 3;
  const so::AdamWScalars s = so::adamw_scalars(options);
  EXPECT_EQ(s.neg_step_size, static_cast<float>(-(1e-3 / (1.0 - std::pow(0.9, 3.0)))));
  EXPECT_EQ(s.lerp_coeff, static_cast<float>(1.0 - 0.9));
  EXPECT_FALSE(s.lerp_from_end);
  options.beta1 = 0.2;  // weight 0.8 >= 0.5: ATen's lerp works from the end
  EXPECT_TRUE(so::adamw_scalars(options).lerp_from_end);
  options.step = 0;
  EXPECT_THROW(so::adamw_scalars(options), std::invalid_argument);
  options.step = 1;
  options.beta2 = 1.0;
  EXPECT_THROW(so::adamw_scalars(options), std::invalid_argument);
}
