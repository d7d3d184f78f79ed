// Per-element float32 <-> bfloat16 / float16 conversions, shared by every kernel.
//
// These functions are the single definition of shardwise's rounding: the scalar CPU kernel calls
// them directly, the CUDA kernels call them per thread, and the AVX-512 kernels are tested to be
// bit-identical to them. They work on raw bit patterns (uint32_t for float32, uint16_t for the
// 16-bit formats) so that no host or device float environment (FTZ/DAZ, fast-math) can change a
// result.
//
// Round to nearest even (RNE), bfloat16: bf16 is the top 16 bits of a float32. Adding
// 0x7fff + lsb, where lsb is bit 16 of the input, carries into bit 16 exactly when the dropped
// low half is above one half ulp, or exactly one half ulp with an odd kept half; a carry out of
// the mantissa increments the exponent, which turns the largest finite values into Inf just as
// IEEE rounding does. bf16 has float32's exponent range, so denormals need no special case.
// NaN becomes 0xffff, which is what `tensor.to(torch.bfloat16)` gives on x86 CPUs with AVX2 or
// AVX-512 (its scalar fallback gives 0x7fc0; CUDA gives 0x7fff: every one of them is a NaN).
//
// RNE, float16: the exponent is rebiased from 127 to 15 and 13 mantissa bits are rounded off the
// same way. Magnitudes >= 65520 (half way between 65504, the largest half, and 2^16) overflow to
// Inf; magnitudes below 2^-14 become half denormals by shifting the full 24-bit significand right
// and rounding the shifted-out bits to nearest even; 2^-25 and below round to zero. NaN keeps its
// sign and top 10 payload bits and becomes quiet, as the x86 instruction vcvtps2ph (and so
// `tensor.to(torch.float16)` on CPU) does.
//
// Stochastic rounding to bfloat16: instead of adding 0x7fff + lsb, add a uniformly random 16-bit
// value `noise` and truncate. The kept half is rounded up with probability (dropped half) / 2^16,
// so the expected result equals the input (unbiased). `noise` comes from a counter-based hash of
// (seed, counter), so every element's draw is independent of thread and vector layout and a
// (seed, counter) pair always gives the same bits on CPU and GPU.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/macros.h"

namespace shardwise::precision {

constexpr uint16_t kBf16Nan = 0xffff;

SW_HOST_DEVICE SW_INLINE uint32_t float_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

SW_HOST_DEVICE SW_INLINE float bits_float(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

SW_HOST_DEVICE SW_INLINE bool is_nan_bits(uint32_t bits) {
  return (bits & 0x7fffffffu) > 0x7f800000u;
}

// float32 -> bfloat16, round to nearest even.
SW_HOST_DEVICE SW_INLINE uint16_t float_to_bf16_bits(uint32_t bits) {
  if (is_nan_bits(bits)) {
    return kBf16Nan;
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

// bfloat16 -> float32: exact, a shift.
SW_HOST_DEVICE SW_INLINE uint32_t bf16_to_float_bits(uint16_t bits) {
  return static_cast<uint32_t>(bits) << 16;
}

// float32 -> float16, round to nearest even.
SW_HOST_DEVICE SW_INLINE uint16_t float_to_half_bits(uint32_t bits) {
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // Inf, or NaN made quiet with its payload kept
    const uint32_t payload = magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu) : 0u;
    return static_cast<uint16_t>(sign | 0x7c00u | payload);
  }
  if (magnitude >= 0x477ff000u) {  // >= 65520 rounds to Inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (magnitude >= 0x38800000u) {                       // >= 2^-14: a normal half
    const uint32_t rebiased = magnitude - 0x38000000u;  // exponent bias 127 -> 15
    const uint32_t lsb = (rebiased >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((rebiased + 0xfffu + lsb) >> 13));
  }
  if (magnitude <= 0x33000000u) {  // <= 2^-25 rounds to zero (2^-25 is a tie with even zero)
    return sign;
  }
  // A half denormal: value = significand * 2^(exponent - 150), and the half denormal unit is
  // 2^-24, so the half's bits are significand >> (126 - exponent), rounded to nearest even.
  const uint32_t exponent = magnitude >> 23;
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  uint32_t result = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (remainder > halfway || (remainder == halfway && (result & 1u))) {
    ++result;
  }
  return static_cast<uint16_t>(sign | result);
}

// float16 -> float32: exact. Denormal halves are normalised; NaN becomes quiet with its payload.
SW_HOST_DEVICE SW_INLINE uint32_t half_to_float_bits(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1fu) {
    return sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  }
  if (exponent != 0) {
    return sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  if (mantissa == 0) {
    return sign;
  }
  // Denormal: shift the leading one up to the implicit bit, lowering the exponent to match.
  uint32_t float_exponent = 113u;  // 2^-14 is the exponent of the smallest normal half
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --float_exponent;
  }
  return sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13);
}

// A 32-bit bijective mixer (the "lowbias32" constants of Chris Wellons' hash-prospector).
SW_HOST_DEVICE SW_INLINE uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The key that, with the low 32 bits of a counter, selects an element's random draw. It depends on
// the seed and the high 32 bits of the counter, so kernels compute it once per 2^32 elements.
SW_HOST_DEVICE SW_INLINE uint32_t stochastic_key(uint64_t seed, uint32_t counter_high) {
  return mix32(static_cast<uint32_t>(seed) ^
               mix32(static_cast<uint32_t>(seed >> 32) ^ mix32(counter_high + 0x9e3779b9u)));
}

// The 16 random bits for the element whose counter has low half `counter_low`.
SW_HOST_DEVICE SW_INLINE uint32_t stochastic_noise(uint32_t key, uint32_t counter_low) {
  return mix32(counter_low ^ key) >> 16;
}

// float32 -> bfloat16 with stochastic rounding; `noise` is uniform in [0, 2^16).
SW_HOST_DEVICE SW_INLINE uint16_t float_to_bf16_stochastic_bits(uint32_t bits, uint32_t noise) {
  if (is_nan_bits(bits)) {
    return kBf16Nan;
  }
  if ((bits & 0x7fffffffu) == 0x7f800000u) {  // Inf stays Inf
    return static_cast<uint16_t>(bits >> 16);
  }
  return static_cast<uint16_t>((bits + noise) >> 16);
}

#if !defined(__CUDA_ARCH__)
// Calls fn(begin, end, key, counter_low) for each run [begin, end) of elements whose counters
// (counter_base + index) share their high 32 bits; counter_low is the low half of begin's counter.
template <typename Fn>
inline void for_each_counter_run(uint64_t seed, uint64_t counter_base, int64_t numel, Fn fn) {
  int64_t begin = 0;
  while (begin < numel) {
    const uint64_t counter = counter_base + static_cast<uint64_t>(begin);
    const uint64_t to_boundary = (uint64_t{1} << 32) - (counter & 0xffffffffu);
    const uint64_t remaining = static_cast<uint64_t>(numel - begin);
    const int64_t end =
        remaining <= to_boundary ? numel : begin + static_cast<int64_t>(to_boundary);
    fn(begin, end, stochastic_key(seed, static_cast<uint32_t>(counter >> 32)),
       static_cast<uint32_t>(counter));
    begin = end;
  }
}
#endif

SW_HOST_DEVICE SW_INLINE bool bf16_is_nonfinite(uint16_t bits) {
  return (bits & 0x7f80u) == 0x7f80u;
}

SW_HOST_DEVICE SW_INLINE bool half_is_nonfinite(uint16_t bits) {
  return (bits & 0x7c00u) == 0x7c00u;
}

SW_HOST_DEVICE SW_INLINE bool float_is_nonfinite(uint32_t bits) {
  return (bits & 0x7f800000u) == 0x7f800000u;
}

}  // namespace shardwise::precision
