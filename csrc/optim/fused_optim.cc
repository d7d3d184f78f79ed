// The fused AdamW / SGD steps on the CPU: the step's scalars (derived in double as torch.optim's
// Python code does, then rounded to float once), span slicing, the portable scalar loops over
// optim_math.h, and the run-time dispatch to the AVX-512 loops of fused_optim_avx512.cc.
#include "optim/fused_optim.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "optim/fused_optim_avx512.h"

namespace shardwise::optim {
namespace {

size_t bytes_of(Format format) { return format == Format::kFloat32 ? 4 : 2; }

void* offset(void* data, int64_t elements, Format format) {
  return data == nullptr ? nullptr : static_cast<char*>(data) + elements * bytes_of(format);
}

const void* offset(const void* data, int64_t elements, Format format) {
  return data == nullptr ? nullptr : static_cast<const char*>(data) + elements * bytes_of(format);
}

void check_beta(const char* name, double beta) {
  if (!(beta >= 0.0 && beta < 1.0)) {
    throw std::invalid_argument(std::string(name) + " must be in [0, 1), got " +
                                std::to_string(beta));
  }
}

void scalar_adamw(const AdamWSpan& span, const AdamWScalars& scalars) {
  for (int64_t i = 0; i < span.count; ++i) {
    adamw_element(span.param[i], span.exp_avg[i], span.exp_avg_sq[i],
                  load_widened(span.grad, i, span.grad_format), scalars);
    if (span.low_precision != nullptr) {
      static_cast<uint16_t*>(span.low_precision)[i] =
          round_low_precision(span.param[i], span.low_precision_format);
    }
  }
}

void scalar_sgd(const SgdSpan& span, const SgdScalars& scalars) {
  float unused = 0.0f;  // the buffer of a step without momentum
  for (int64_t i = 0; i < span.count; ++i) {
    float& buffer = span.momentum_buffer != nullptr ? span.momentum_buffer[i] : unused;
    sgd_element(span.param[i], buffer, load_widened(span.grad, i, span.grad_format), scalars);
    if (span.low_precision != nullptr) {
      static_cast<uint16_t*>(span.low_precision)[i] =
          round_low_precision(span.param[i], span.low_precision_format);
    }
  }
}

}  // namespace

AdamWSpan slice(const AdamWSpan& span, int64_t begin, int64_t count) {
  AdamWSpan piece = span;
  piece.param = span.param + begin;
  piece.grad = offset(span.grad, begin, span.grad_format);
  piece.exp_avg = span.exp_avg + begin;
  piece.exp_avg_sq = span.exp_avg_sq + begin;
  piece.low_precision = offset(span.low_precision, begin, span.low_precision_format);
  piece.count = count;
  return piece;
}

SgdSpan slice(const SgdSpan& span, int64_t begin, int64_t count) {
  SgdSpan piece = span;
  piece.param = span.param + begin;
  piece.grad = offset(span.grad, begin, span.grad_format);
  piece.momentum_buffer = span.momentum_buffer == nullptr ? nullptr : span.momentum_buffer + begin;
  piece.low_precision = offset(span.low_precision, begin, span.low_precision_format);
  piece.count = count;
  return piece;
}

AdamWScalars adamw_scalars(const AdamWOptions& options) {
  if (options.step < 1) {
    throw std::invalid_argument("step must be >= 1 (the first step is 1), got " +
                                std::to_string(options.step));
  }
  check_beta("beta1", options.beta1);
  check_beta("beta2", options.beta2);
  // torch: bias_correction1 = 1 - beta1 ** step; step_size = lr / bias_correction1;
  // bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5 (Python's float ** is C pow).
  const double step = static_cast<double>(options.step);
  const double bias_correction1 = 1.0 - std::pow(options.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(options.beta2, step);
  const double lerp_weight = 1.0 - options.beta1;
  AdamWScalars s;
  s.grad_scale = static_cast<float>(options.grad_scale);
  s.scale_grad = s.grad_scale != 1.0f;
  s.decay = static_cast<float>(1.0 - options.lr * options.weight_decay);
  s.apply_decay = options.weight_decay != 0.0;
  const float weight = static_cast<float>(lerp_weight);
  s.lerp_from_end = !(std::fabs(weight) < 0.5f);  // ATen's is_lerp_weight_small, on the float
  s.lerp_coeff = s.lerp_from_end ? weight - 1.0f : weight;
  s.beta2 = static_cast<float>(options.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - options.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));
  s.eps = static_cast<float>(options.eps);
  s.neg_step_size = static_cast<float>(-(options.lr / bias_correction1));
  return s;
}

SgdScalars sgd_scalars(const SgdOptions& options) {
  SgdScalars s;
  s.grad_scale = static_cast<float>(options.grad_scale);
  s.scale_grad = s.grad_scale != 1.0f;
  s.weight_decay = static_cast<float>(options.weight_decay);
  s.apply_decay = options.weight_decay != 0.0;
  s.momentum = static_cast<float>(options.momentum);
  s.use_momentum = options.momentum != 0.0;
  s.one_minus_dampening = static_cast<float>(1.0 - options.dampening);
  s.nesterov = options.nesterov;
  s.first_step = options.first_step;
  s.neg_lr = static_cast<float>(-options.lr);
  return s;
}

void fused_adamw_cpu(const AdamWSpan* spans,
                     int64_t count,
                     const AdamWScalars& scalars,
                     CpuIsa isa) {
  for (int64_t i = 0; i < count; ++i) {
    if (spans[i].count <= 0) continue;
    if (isa >= CpuIsa::kAvx512) {
      avx512::adamw(spans[i], scalars);
    } else {
      scalar_adamw(spans[i], scalars);
    }
  }
}

void fused_sgd_cpu(const SgdSpan* spans, int64_t count, const SgdScalars& scalars, CpuIsa isa) {
  for (int64_t i = 0; i < count; ++i) {
    if (spans[i].count <= 0) continue;
    if (isa >= CpuIsa::kAvx512) {
      avx512::sgd(spans[i], scalars);
    } else {
      scalar_sgd(spans[i], scalars);
    }
  }
}

}  // namespace shardwise::optim
