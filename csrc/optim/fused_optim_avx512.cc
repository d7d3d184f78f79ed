// AVX-512 loops of the fused AdamW and SGD steps: 16 elements per step, the tail through masked
// loads and stores, every lane computing exactly what optim_math.h computes for one element: the
// same operations in the same order, the explicit fmaf as vfmadd, sqrt and divide correctly
// rounded, and the two products that feed an add (grad * grad_scale, param * decay) passed
// through an empty asm (unfused) so GCC cannot contract them into an FMA either.
// Widening: bfloat16 is shifted into the top half, float16 converted by vcvtph2ps (exact). The
// low-precision copy: the integer round to nearest even of cast_math.h for bfloat16 (NaN ->
// 0xffff), vcvtps2ph for float16 (tested bit-identical to cast_math.h by the cast tests).
#include "optim/fused_optim_avx512.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12 reports its own intrinsics' deliberately undefined registers as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <type_traits>

#define SW_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))

namespace shardwise::optim::avx512 {
namespace {

constexpr int64_t kLanes = 16;

SW_AVX512 inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= kLanes ? static_cast<__mmask16>(0xffff)
                             : static_cast<__mmask16>((1u << remaining) - 1u);
}

SW_AVX512 inline __m512 mul_unfused(__m512 a, __m512 b) {
  __m512 product = _mm512_mul_ps(a, b);
  __asm__("" : "+v"(product));
  return product;
}

template <bool kTail>
SW_AVX512 inline __m512 load_float(const float* p, __mmask16 mask) {
  return kTail ? _mm512_maskz_loadu_ps(mask, p) : _mm512_loadu_ps(p);
}

template <bool kTail>
SW_AVX512 inline void store_float(float* p, __mmask16 mask, __m512 value) {
  if (kTail) {
    _mm512_mask_storeu_ps(p, mask, value);
  } else {
    _mm512_storeu_ps(p, value);
  }
}

template <Format kFormat, bool kTail>
SW_AVX512 inline __m512 load_widened(const void* data, int64_t i, __mmask16 mask) {
  if constexpr (kFormat == Format::kFloat32) {
    return load_float<kTail>(static_cast<const float*>(data) + i, mask);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(data) + i;
    const __m256i narrow = kTail ? _mm256_maskz_loadu_epi16(mask, p)
                                 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (kFormat == Format::kFloat16) {
      return _mm512_cvtph_ps(narrow);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(narrow), 16));
    }
  }
}

// cast_math.h's float_to_bf16_bits on 16 lanes (NaN lanes become 0xffff).
SW_AVX512 inline __m256i round_bf16(__m512 value) {
  const __m512i bits = _mm512_castps_si512(value);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(
      _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(precision::kBf16Nan)));
}

// kLow: kFloat32 means "no low-precision copy".
template <Format kLow, bool kTail>
SW_AVX512 inline void store_low_precision(void* data, int64_t i, __mmask16 mask, __m512 value) {
  if constexpr (kLow != Format::kFloat32) {
    const __m256i packed =
        kLow == Format::kFloat16
            ? _mm512_cvtps_ph(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
            : round_bf16(value);
    uint16_t* p = static_cast<uint16_t*>(data) + i;
    if (kTail) {
      _mm256_mask_storeu_epi16(p, mask, packed);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
    }
  }
}

// The step's scalars broadcast to 16 lanes.
struct AdamWVectors {
  __m512 grad_scale, decay, lerp_coeff, beta2, one_minus_beta2, bias_correction2_sqrt, eps,
      neg_step_size;
  SW_AVX512 explicit AdamWVectors(const AdamWScalars& s)
      : grad_scale(_mm512_set1_ps(s.grad_scale)),
        decay(_mm512_set1_ps(s.decay)),
        lerp_coeff(_mm512_set1_ps(s.lerp_coeff)),
        beta2(_mm512_set1_ps(s.beta2)),
        one_minus_beta2(_mm512_set1_ps(s.one_minus_beta2)),
        bias_correction2_sqrt(_mm512_set1_ps(s.bias_correction2_sqrt)),
        eps(_mm512_set1_ps(s.eps)),
        neg_step_size(_mm512_set1_ps(s.neg_step_size)) {}
};

template <Format kGrad, Format kLow>
struct AdamWKernel {
  const AdamWSpan& span;
  const AdamWScalars& s;
  AdamWVectors v;

  template <bool kTail>
  SW_AVX512 void step(int64_t i, __mmask16 mask) const {
    __m512 grad = load_widened<kGrad, kTail>(span.grad, i, mask);
    __m512 param = load_float<kTail>(span.param + i, mask);
    __m512 exp_avg = load_float<kTail>(span.exp_avg + i, mask);
    __m512 exp_avg_sq = load_float<kTail>(span.exp_avg_sq + i, mask);
    if (s.scale_grad) grad = mul_unfused(grad, v.grad_scale);
    if (s.apply_decay) param = mul_unfused(param, v.decay);
    exp_avg = _mm512_fmadd_ps(v.lerp_coeff, _mm512_sub_ps(grad, exp_avg),
                              s.lerp_from_end ? grad : exp_avg);
    exp_avg_sq = _mm512_fmadd_ps(_mm512_mul_ps(v.one_minus_beta2, grad), grad,
                                 _mm512_mul_ps(exp_avg_sq, v.beta2));
    const __m512 denom =
        _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(exp_avg_sq), v.bias_correction2_sqrt), v.eps);
    param = _mm512_add_ps(param, _mm512_div_ps(_mm512_mul_ps(v.neg_step_size, exp_avg), denom));
    store_float<kTail>(span.param + i, mask, param);
    store_float<kTail>(span.exp_avg + i, mask, exp_avg);
    store_float<kTail>(span.exp_avg_sq + i, mask, exp_avg_sq);
    store_low_precision<kLow, kTail>(span.low_precision, i, mask, param);
  }
};

template <Format kGrad, Format kLow>
struct SgdKernel {
  const SgdSpan& span;
  const SgdScalars& s;
  __m512 grad_scale, weight_decay, momentum, one_minus_dampening, neg_lr;

  template <bool kTail>
  SW_AVX512 void step(int64_t i, __mmask16 mask) const {
    __m512 grad = load_widened<kGrad, kTail>(span.grad, i, mask);
    __m512 param = load_float<kTail>(span.param + i, mask);
    if (s.scale_grad) grad = mul_unfused(grad, grad_scale);
    if (s.apply_decay) grad = _mm512_fmadd_ps(param, weight_decay, grad);
    if (s.use_momentum) {
      __m512 buffer = grad;
      if (!s.first_step) {
        buffer = _mm512_fmadd_ps(
            grad, one_minus_dampening,
            _mm512_mul_ps(load_float<kTail>(span.momentum_buffer + i, mask), momentum));
      }
      store_float<kTail>(span.momentum_buffer + i, mask, buffer);
      grad = s.nesterov ? _mm512_fmadd_ps(buffer, momentum, grad) : buffer;
    }
    param = _mm512_fmadd_ps(grad, neg_lr, param);
    store_float<kTail>(span.param + i, mask, param);
    store_low_precision<kLow, kTail>(span.low_precision, i, mask, param);
  }
};

template <typename Kernel>
SW_AVX512 void for_each_vector(const Kernel& kernel, int64_t count) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    kernel.template step<false>(i, static_cast<__mmask16>(0xffff));
  }
  if (i < count) {
    kernel.template step<true>(i, tail_mask(count - i));
  }
}

// Calls fn.template run<kGrad, kLow>() for the span's formats (kLow = kFloat32: no copy).
template <typename Span, typename Fn>
void dispatch_formats(const Span& span, const Fn& fn) {
  const Format low = span.low_precision == nullptr ? Format::kFloat32 : span.low_precision_format;
  auto with_low = [&](auto grad_tag) {
    constexpr Format kGrad = decltype(grad_tag)::value;
    if (low == Format::kBFloat16) {
      fn.template run<kGrad, Format::kBFloat16>();
    } else if (low == Format::kFloat16) {
      fn.template run<kGrad, Format::kFloat16>();
    } else {
      fn.template run<kGrad, Format::kFloat32>();
    }
  };
  if (span.grad_format == Format::kBFloat16) {
    with_low(std::integral_constant<Format, Format::kBFloat16>{});
  } else if (span.grad_format == Format::kFloat16) {
    with_low(std::integral_constant<Format, Format::kFloat16>{});
  } else {
    with_low(std::integral_constant<Format, Format::kFloat32>{});
  }
}

struct RunAdamW {
  const AdamWSpan& span;
  const AdamWScalars& s;
  template <Format kGrad, Format kLow>
  SW_AVX512 void run() const {
    for_each_vector(AdamWKernel<kGrad, kLow>{span, s, AdamWVectors(s)}, span.count);
  }
};

struct RunSgd {
  const SgdSpan& span;
  const SgdScalars& s;
  template <Format kGrad, Format kLow>
  SW_AVX512 void run() const {
    const SgdKernel<kGrad, kLow> kernel{span,
                                        s,
                                        _mm512_set1_ps(s.grad_scale),
                                        _mm512_set1_ps(s.weight_decay),
                                        _mm512_set1_ps(s.momentum),
                                        _mm512_set1_ps(s.one_minus_dampening),
                                        _mm512_set1_ps(s.neg_lr)};
    for_each_vector(kernel, span.count);
  }
};

}  // namespace

void adamw(const AdamWSpan& span, const AdamWScalars& scalars) {
  dispatch_formats(span, RunAdamW{span, scalars});
}

void sgd(const SgdSpan& span, const SgdScalars& scalars) {
  dispatch_formats(span, RunSgd{span, scalars});
}

}  // namespace shardwise::optim::avx512

#else  // not x86-64: never called, since detected_cpu_isa() is kScalar there.

#include <stdexcept>

namespace shardwise::optim::avx512 {
void adamw(const AdamWSpan&, const AdamWScalars&) {
  throw std::logic_error("AVX-512 kernels are not compiled for this architecture");
}
void sgd(const SgdSpan&, const SgdScalars&) {
  throw std::logic_error("AVX-512 kernels are not compiled for this architecture");
}
}  // namespace shardwise::optim::avx512

#endif
