// LAMB without torch (optim/lamb.h): the step's scalars and their checks, the trust ratio's
// clamping and its zero cases, and a step split into pieces equal to the step over the whole
// array (the sums of squares added up, as ranks add up their shards'), checked against a
// double-precision LAMB.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "optim/lamb.h"

namespace so = shardwise::optim;

namespace {

so::LambSpan span_of(std::vector<float>& p,
                     const std::vector<float>& g,
                     std::vector<float>& m,
                     std::vector<float>& v,
                     int64_t begin,
                     int64_t count) {
  so::LambSpan span;
  span.param = p.data() + begin;
  span.grad = g.data() + begin;
  span.exp_avg = m.data() + begin;
  span.exp_avg_sq = v.data() + begin;
  span.count = count;
  return span;
}

// One LAMB step over p cut at `cuts` (span boundaries), its pieces' sums added up.
void step_in_pieces(std::vector<float>& p,
                    const std::vector<float>& g,
                    std::vector<float>& m,
                    std::vector<float>& v,
                    const std::vector<int64_t>& cuts,
                    const so::LambOptions& options) {
  std::vector<so::LambSpan> spans;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    spans.push_back(span_of(p, g, m, v, cuts[k], cuts[k + 1] - cuts[k]));
  }
  const so::LambScalars scalars = so::lamb_scalars(options);
  std::vector<double> squares(2 * spans.size(), 0.0);
  so::lamb_moments_cpu(spans.data(), static_cast<int64_t>(spans.size()), scalars, squares.data());
  double param_sq = 0.0, direction_sq = 0.0;
  for (size_t k = 0; k < spans.size(); ++k) {
    param_sq += squares[2 * k];
    direction_sq += squares[2 * k + 1];
  }
  const float scaled =
      static_cast<float>(scalars.step_size * so::lamb_coefficient(param_sq, direction_sq, options));
  std::vector<float> steps(spans.size(), scaled);
  so::lamb_apply_cpu(spans.data(), static_cast<int64_t>(spans.size()), scalars, steps.data());
}

}  // namespace

TEST(Lamb, ScalarsFollowTheOptionsAndRejectBadOnes) {
  so::LambOptions o;
  o.lr = 0.1;
  o.step = 3;
  const so::LambScalars s = so::lamb_scalars(o);
  const double expected = 0.1 * std::sqrt(1 - std::pow(0.999, 3)) / (1 - std::pow(0.9, 3));
  EXPECT_FLOAT_EQ(s.step_size, static_cast<float>(expected));
  o.bias_correction = false;
  EXPECT_FLOAT_EQ(so::lamb_scalars(o).step_size, 0.1f);
  for (auto bad :
       {+[](so::LambOptions& x) { x.step = 0; }, +[](so::LambOptions& x) { x.beta1 = 1.0; },
        +[](so::LambOptions& x) { x.beta2 = -0.1; },
        +[](so::LambOptions& x) { x.min_coeff = 11.0; }}) {
    so::LambOptions broken;
    bad(broken);
    EXPECT_THROW(so::lamb_scalars(broken), std::invalid_argument);
  }
}

TEST(Lamb, TrustRatioIsClampedAndOneWhereANormIsZero) {
  so::LambOptions o;  // [0.01, 10]
  EXPECT_DOUBLE_EQ(so::lamb_coefficient(4.0, 1.0, o), 2.0);
  EXPECT_DOUBLE_EQ(so::lamb_coefficient(400.0, 1.0, o), 10.0);
  EXPECT_DOUBLE_EQ(so::lamb_coefficient(1e-8, 1.0, o), 0.01);
  EXPECT_DOUBLE_EQ(so::lamb_coefficient(0.0, 1.0, o), 1.0);
  EXPECT_DOUBLE_EQ(so::lamb_coefficient(1.0, 0.0, o), 1.0);
}

TEST(Lamb, PiecesOfOneParameterStepAsTheWholeAndAsDoublePrecision) {
  const int64_t n = 1003;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p0(n), g(n);
  for (auto& x : p0) x = normal(rng);
  for (auto& x : g) x = normal(rng);
  so::LambOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  std::vector<float> whole = p0, m1(n, 0.0f), v1(n, 0.0f);
  std::vector<float> parts = p0, m2(n, 0.0f), v2(n, 0.0f);
  for (int64_t step = 1; step <= 3; ++step) {
    o.step = step;
    step_in_pieces(whole, g, m1, v1, {0, n}, o);
    step_in_pieces(parts, g, m2, v2, {0, 0, 17, 500, 501, n}, o);  // an empty piece too
  }
  // double precision: the same three steps
  std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0), u(n);
  for (int step = 1; step <= 3; ++step) {
    double w_sq = 0.0, u_sq = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      u[i] = m[i] / (std::sqrt(v[i]) + o.eps) + 0.1 * p[i];
      w_sq += p[i] * p[i];
      u_sq += u[i] * u[i];
    }
    const double ratio = std::sqrt(w_sq) / std::sqrt(u_sq);
    const double step_size =
        0.01 * std::sqrt(1 - std::pow(0.999, step)) / (1 - std::pow(0.9, step));
    for (int64_t i = 0; i < n; ++i) p[i] -= step_size * ratio * u[i];
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(parts[i], whole[i], 1e-6 * std::abs(whole[i]) + 1e-7) << i;
    EXPECT_NEAR(whole[i], p[i], 1e-5 * std::abs(p[i]) + 1e-6) << i;
  }
}
