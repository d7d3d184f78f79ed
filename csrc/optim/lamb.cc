// LAMB on the CPU: the step's scalars and the two scalar passes of lamb.h.
#include "optim/lamb.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace shardwise::optim {

LambScalars lamb_scalars(const LambOptions& o) {
  if (o.step < 1) {
    throw std::invalid_argument("LAMB: step must be >= 1 (the first step is 1), got " +
                                std::to_string(o.step));
  }
  for (const auto& [name, beta] : {std::pair{"beta1", o.beta1}, std::pair{"beta2", o.beta2}}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      throw std::invalid_argument(std::string("LAMB: ") + name + " must be in [0, 1), got " +
                                  std::to_string(beta));
    }
  }
  if (!(o.min_coeff <= o.max_coeff)) {
    throw std::invalid_argument("LAMB: min_coeff " + std::to_string(o.min_coeff) +
                                " exceeds max_coeff " + std::to_string(o.max_coeff));
  }
  LambScalars s;
  s.grad_scale = static_cast<float>(o.grad_scale);
  s.scale_grad = o.grad_scale != 1.0;
  s.beta1 = static_cast<float>(o.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  s.eps = static_cast<float>(o.eps);
  s.eps_inside_sqrt = o.eps_inside_sqrt;
  s.weight_decay = static_cast<float>(o.weight_decay);
  double step_size = o.lr;
  if (o.bias_correction) {
    const double t = static_cast<double>(o.step);
    step_size *= std::sqrt(1.0 - std::pow(o.beta2, t)) / (1.0 - std::pow(o.beta1, t));
  }
  s.step_size = static_cast<float>(step_size);
  return s;
}

void lamb_moments_cpu(const LambSpan* spans,
                      int64_t count,
                      const LambScalars& scalars,
                      double* squares) {
  for (int64_t k = 0; k < count; ++k) {
    const LambSpan& span = spans[k];
    double param_sq = 0.0, direction_sq = 0.0;
    for (int64_t i = 0; i < span.count; ++i) {
      const float param = span.param[i];
      const float direction =
          lamb_moments_element(param, span.exp_avg[i], span.exp_avg_sq[i],
                               load_widened(span.grad, i, span.grad_format), scalars);
      param_sq += static_cast<double>(param) * param;
      direction_sq += static_cast<double>(direction) * direction;
    }
    squares[2 * k] += param_sq;
    squares[2 * k + 1] += direction_sq;
  }
}

double lamb_coefficient(double param_squares,
                        double direction_squares,
                        const LambOptions& options) {
  const double param_norm = std::sqrt(param_squares);
  const double direction_norm = std::sqrt(direction_squares);
  if (param_norm == 0.0 || direction_norm == 0.0) return 1.0;
  const double ratio = param_norm / direction_norm;
  return ratio > options.max_coeff ? options.max_coeff
                                   : (ratio < options.min_coeff ? options.min_coeff : ratio);
}

void lamb_apply_cpu(const LambSpan* spans,
                    int64_t count,
                    const LambScalars& scalars,
                    const float* scaled_steps) {
  for (int64_t k = 0; k < count; ++k) {
    const LambSpan& span = spans[k];
    for (int64_t i = 0; i < span.count; ++i) {
      lamb_apply_element(span.param[i], span.exp_avg[i], span.exp_avg_sq[i], scaled_steps[k],
                         scalars);
      if (span.low_precision != nullptr) {
        static_cast<uint16_t*>(span.low_precision)[i] =
            round_low_precision(span.param[i], span.low_precision_format);
      }
    }
  }
}

}  // namespace shardwise::optim
