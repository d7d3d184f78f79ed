// Per-element float32 AdamW and SGD-with-momentum updates, shared by every kernel (the scalar CPU
// loop, the AVX-512 loop, which is tested bit-identical to these, and the CUDA kernel).
//
// The arithmetic follows torch.optim.AdamW / torch.optim.SGD on CPU float32 operation by
// operation, including where torch's vectorised kernels fuse a multiply and an add (measured on
// torch 2.14, AVX-512 build):
//   param      = param * decay                                   (decay = 1 - lr * weight_decay)
//   exp_avg    = fma(lerp_coeff, grad - exp_avg, lerp_from_end ? grad : exp_avg)   (lerp_, 1-beta1)
//   exp_avg_sq = fma(one_minus_beta2 * grad, grad, exp_avg_sq * beta2)           (mul_, addcmul_)
//   denom      = sqrt(exp_avg_sq) / bias_correction2_sqrt + eps
//   param      = param + (neg_step_size * exp_avg) / denom                        (addcdiv_)
// ATen's lerp is `weight < 0.5 ? self + weight * (end - self) : end - (end - self) * (1 - weight)`,
// which its vector kernel evaluates as one fma with lerp_coeff = weight or weight - 1.
// SGD (torch's `add(x, alpha=a)` is fma(x, a, self)):
//   grad = fma(param, weight_decay, grad);  momentum_buffer = first_step ? grad :
//   fma(grad, one_minus_dampening, momentum_buffer * momentum);  grad = nesterov ?
//   fma(momentum_buffer, momentum, grad) : momentum_buffer;  param = fma(grad, neg_lr, param)
// Every multiply-add is an explicit fmaf; the two products that feed a later add or subtract
// (grad * grad_scale, param * decay) go through mul_unfused, so no compiler contraction
// (GCC's default -ffp-contract=fast on FMA targets, nvcc --fmad) can change a result. The scalars
// are derived in double on the host exactly as torch's Python code does (fused_optim.cc) and
// rounded to float once. The gradient is first widened to float32 and, when scale_grad is set,
// multiplied by grad_scale.
#pragma once

#include <math.h>

#include <cstdint>

#include "common/macros.h"
#include "precision/cast_kernels.h"
#include "precision/cast_math.h"

namespace shardwise::optim {

using precision::Format;

// AdamW's per-call scalars, already rounded to float32 (see adamw_scalars in fused_optim.h).
struct AdamWScalars {
  float grad_scale = 1.0f;
  bool scale_grad = false;     // grad_scale != 1
  float decay = 1.0f;          // 1 - lr * weight_decay
  bool apply_decay = false;    // weight_decay != 0
  float lerp_coeff = 0.1f;     // 1 - beta1, or (1 - beta1) - 1 when lerp_from_end
  bool lerp_from_end = false;  // 1 - beta1 >= 0.5
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bias_correction2_sqrt = 1.0f;
  float eps = 1e-8f;
  float neg_step_size = -1e-3f;  // -lr / bias_correction1
};

// SGD's per-call scalars, already rounded to float32.
struct SgdScalars {
  float grad_scale = 1.0f;
  bool scale_grad = false;
  float weight_decay = 0.0f;
  bool apply_decay = false;
  float momentum = 0.0f;
  bool use_momentum = false;  // momentum != 0: a momentum buffer exists
  float one_minus_dampening = 1.0f;
  bool nesterov = false;
  bool first_step = true;  // the buffer is initialised to the gradient
  float neg_lr = -0.01f;
};

// a * b rounded to float, never fused with a later add: CUDA's __fmul_rn, and on the host an
// empty asm that hides from the compiler that its operand is a product.
SW_HOST_DEVICE SW_INLINE float mul_unfused(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  float product = a * b;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __asm__("" : "+x"(product));
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
  __asm__("" : "+w"(product));
#else
  volatile float opaque = product;
  product = opaque;
#endif
  return product;
#endif
}

SW_HOST_DEVICE SW_INLINE float load_widened(const void* data, int64_t i, Format format) {
  if (format == Format::kBFloat16) {
    return precision::bits_float(
        precision::bf16_to_float_bits(static_cast<const uint16_t*>(data)[i]));
  }
  if (format == Format::kFloat16) {
    return precision::bits_float(
        precision::half_to_float_bits(static_cast<const uint16_t*>(data)[i]));
  }
  return static_cast<const float*>(data)[i];
}

// The low-precision copy of `value` (round to nearest even), as 16 bits.
SW_HOST_DEVICE SW_INLINE uint16_t round_low_precision(float value, Format format) {
  const uint32_t bits = precision::float_bits(value);
  return format == Format::kFloat16 ? precision::float_to_half_bits(bits)
                                    : precision::float_to_bf16_bits(bits);
}

SW_HOST_DEVICE SW_INLINE void adamw_element(
    float& param, float& exp_avg, float& exp_avg_sq, float grad, const AdamWScalars& s) {
  if (s.scale_grad) {
    grad = mul_unfused(grad, s.grad_scale);
  }
  if (s.apply_decay) {
    param = mul_unfused(param, s.decay);
  }
  exp_avg = fmaf(s.lerp_coeff, grad - exp_avg, s.lerp_from_end ? grad : exp_avg);
  exp_avg_sq = fmaf(s.one_minus_beta2 * grad, grad, exp_avg_sq * s.beta2);
  const float denom = sqrtf(exp_avg_sq) / s.bias_correction2_sqrt + s.eps;
  param = param + (s.neg_step_size * exp_avg) / denom;
}

SW_HOST_DEVICE SW_INLINE void sgd_element(float& param,
                                          float& momentum_buffer,
                                          float grad,
                                          const SgdScalars& s) {
  if (s.scale_grad) {
    grad = mul_unfused(grad, s.grad_scale);
  }
  if (s.apply_decay) {
    grad = fmaf(param, s.weight_decay, grad);
  }
  if (s.use_momentum) {
    momentum_buffer =
        s.first_step ? grad : fmaf(grad, s.one_minus_dampening, momentum_buffer * s.momentum);
    grad = s.nesterov ? fmaf(momentum_buffer, s.momentum, grad) : momentum_buffer;
  }
  param = fmaf(grad, s.neg_lr, param);
}

// LAMB's per-call scalars (DeepSpeed's FusedLamb, eps outside or inside the square root),
// rounded to float32 once (see lamb_scalars in lamb.h). Pass 1 updates the moments and yields
// the Adam direction with decoupled weight decay, whose squares and the parameter's are summed
// per parameter; pass 2 recomputes that direction from the moments and steps by
// step_size * coefficient, the coefficient being ||param|| / ||direction|| clamped (lamb.h).
struct LambScalars {
  float grad_scale = 1.0f;
  bool scale_grad = false;
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-6f;
  bool eps_inside_sqrt = false;
  float weight_decay = 0.0f;
  float step_size = 1e-3f;  // lr, times sqrt(1 - beta2^t) / (1 - beta1^t) with bias correction
};

// The direction from the updated moments: exp_avg / denom + weight_decay * param.
SW_HOST_DEVICE SW_INLINE float lamb_direction(float param,
                                              float exp_avg,
                                              float exp_avg_sq,
                                              const LambScalars& s) {
  const float denom = s.eps_inside_sqrt ? sqrtf(exp_avg_sq + s.eps) : sqrtf(exp_avg_sq) + s.eps;
  return exp_avg / denom + mul_unfused(s.weight_decay, param);
}

// Pass 1: the moments updated with this gradient; returns the direction.
SW_HOST_DEVICE SW_INLINE float lamb_moments_element(
    float param, float& exp_avg, float& exp_avg_sq, float grad, const LambScalars& s) {
  if (s.scale_grad) {
    grad = mul_unfused(grad, s.grad_scale);
  }
  exp_avg = mul_unfused(s.beta1, exp_avg) + mul_unfused(s.one_minus_beta1, grad);
  exp_avg_sq = mul_unfused(s.beta2, exp_avg_sq) + mul_unfused(s.one_minus_beta2 * grad, grad);
  return lamb_direction(param, exp_avg, exp_avg_sq, s);
}

// Pass 2: the parameter moved by step_size * coefficient along the direction.
SW_HOST_DEVICE SW_INLINE void lamb_apply_element(
    float& param, float exp_avg, float exp_avg_sq, float scaled_step, const LambScalars& s) {
  param = param - mul_unfused(scaled_step, lamb_direction(param, exp_avg, exp_avg_sq, s));
}

}  // namespace shardwise::optim
