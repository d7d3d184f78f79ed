// AVX-512 cast kernels: 16 elements per step, the tail handled by masked loads and stores, so
// every element goes through the same vector code.
//
// float32 -> bfloat16 (integer form, AVX-512F): the RNE of cast_math.h on 16 lanes,
//   rounded = (bits + 0x7fff + ((bits >> 16) & 1)) >> 16, NaN lanes replaced by 0xffff,
//   then vpmovdw narrows the 32-bit lanes to 16 bits.
// float32 -> bfloat16 (AVX512_BF16): vcvtneps2bf16 rounds to nearest even in one instruction but
//   treats denormal inputs as zero and keeps NaN payloads; vectors holding a denormal or a NaN
//   take the integer form instead, so results stay bit-identical to cast_math.h.
// float32 <-> float16: vcvtps2ph / vcvtph2ps (round to nearest even, denormals kept).
// bfloat16 -> float32: zero-extend to 32 bits and shift left by 16.
// Non-finite check: outputs whose exponent field is all ones set bits of a 16-bit lane mask that
// is OR-accumulated across the loop.
#include "precision/cast_cpu_avx512.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12 reports its own intrinsics' deliberately undefined registers as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "precision/cast_math.h"

#define SW_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))
#define SW_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,avx512bf16")))

namespace shardwise::precision::avx512 {
namespace {

constexpr int64_t kLanes = 16;

SW_AVX512 inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= kLanes ? static_cast<__mmask16>(0xffff)
                             : static_cast<__mmask16>((1u << remaining) - 1u);
}

// The integer RNE of cast_math.h on 16 lanes of float32 bits; returns 16 bf16 in 32-bit lanes.
SW_AVX512 inline __m512i float_to_bf16_rne(__m512i bits) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_castsi512_ps(bits),
                                           _mm512_castsi512_ps(bits), _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(kBf16Nan));
}

SW_AVX512 inline __mmask16 exponent_all_ones(__m512i lanes, int exponent_mask) {
  const __m512i mask = _mm512_set1_epi32(exponent_mask);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(lanes, mask), mask);
}

template <bool kCheck>
SW_AVX512 bool float_to_bf16(const uint32_t* in, uint16_t* out, int64_t numel) {
  __mmask16 nonfinite = 0;
  for (int64_t i = 0; i < numel; i += kLanes) {
    const __mmask16 mask = tail_mask(numel - i);
    const __m512i rounded = float_to_bf16_rne(_mm512_maskz_loadu_epi32(mask, in + i));
    if (kCheck) {
      nonfinite |= exponent_all_ones(rounded, 0x7f80) & mask;
    }
    _mm256_mask_storeu_epi16(out + i, mask, _mm512_cvtepi32_epi16(rounded));
  }
  return nonfinite != 0;
}

template <bool kCheck>
SW_AVX512_BF16 bool float_to_bf16_instruction(const uint32_t* in, uint16_t* out, int64_t numel) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000);
  __mmask16 nonfinite = 0;
  for (int64_t i = 0; i < numel; i += kLanes) {
    const __mmask16 mask = tail_mask(numel - i);
    const __m512i bits = _mm512_maskz_loadu_epi32(mask, in + i);
    // Lanes the instruction gets wrong: exponent 0 with a nonzero mantissa, or exponent 0xff.
    const __mmask16 zero_exponent = _mm512_testn_epi32_mask(bits, exponent);
    const __mmask16 denormal = _mm512_mask_test_epi32_mask(zero_exponent, bits,
                                                           _mm512_set1_epi32(0x007fffff));
    const __mmask16 special = denormal | exponent_all_ones(bits, 0x7f800000);
    __m256i packed;
    if ((special & mask) == 0) {
      packed = (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(bits));
    } else {
      packed = _mm512_cvtepi32_epi16(float_to_bf16_rne(bits));
    }
    if (kCheck) {
      const __m256i exp16 = _mm256_set1_epi16(0x7f80);
      nonfinite |= _mm256_cmpeq_epi16_mask(_mm256_and_si256(packed, exp16), exp16) & mask;
    }
    _mm256_mask_storeu_epi16(out + i, mask, packed);
  }
  return nonfinite != 0;
}

template <bool kCheck>
SW_AVX512 bool float_to_half(const float* in, uint16_t* out, int64_t numel) {
  const __m256i exp16 = _mm256_set1_epi16(0x7c00);
  __mmask16 nonfinite = 0;
  for (int64_t i = 0; i < numel; i += kLanes) {
    const __mmask16 mask = tail_mask(numel - i);
    const __m256i packed = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(mask, in + i),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (kCheck) {
      nonfinite |= _mm256_cmpeq_epi16_mask(_mm256_and_si256(packed, exp16), exp16) & mask;
    }
    _mm256_mask_storeu_epi16(out + i, mask, packed);
  }
  return nonfinite != 0;
}

template <bool kCheck, bool kFromHalf>
SW_AVX512 bool widen_to_float(const uint16_t* in, uint32_t* out, int64_t numel) {
  __mmask16 nonfinite = 0;
  for (int64_t i = 0; i < numel; i += kLanes) {
    const __mmask16 mask = tail_mask(numel - i);
    const __m256i narrow = _mm256_maskz_loadu_epi16(mask, in + i);
    const __m512i wide = kFromHalf ? _mm512_castps_si512(_mm512_cvtph_ps(narrow))
                                   : _mm512_slli_epi32(_mm512_cvtepu16_epi32(narrow), 16);
    if (kCheck) {
      nonfinite |= exponent_all_ones(wide, 0x7f800000) & mask;
    }
    _mm512_mask_storeu_epi32(out + i, mask, wide);
  }
  return nonfinite != 0;
}

template <bool kCheck>
bool dispatch(const void* src, void* dst, int64_t numel, Format from, Format to, bool bf16_insn) {
  if (from == Format::kFloat32 && to == Format::kBFloat16) {
    const auto* in = static_cast<const uint32_t*>(src);
    auto* out = static_cast<uint16_t*>(dst);
    return bf16_insn ? float_to_bf16_instruction<kCheck>(in, out, numel)
                     : float_to_bf16<kCheck>(in, out, numel);
  }
  if (from == Format::kFloat32) {
    return float_to_half<kCheck>(static_cast<const float*>(src), static_cast<uint16_t*>(dst),
                                 numel);
  }
  const auto* in = static_cast<const uint16_t*>(src);
  auto* out = static_cast<uint32_t*>(dst);
  return from == Format::kFloat16 ? widen_to_float<kCheck, true>(in, out, numel)
                                  : widen_to_float<kCheck, false>(in, out, numel);
}

// mix32 of cast_math.h on 16 lanes.
SW_AVX512 inline __m512i mix32(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

// One run of elements sharing a key: noise = mix32(counter_low ^ key) >> 16, then truncate
// bits + noise; NaN lanes become 0xffff and Inf lanes keep their bits.
SW_AVX512 void stochastic_run(const uint32_t* in,
                              uint16_t* out,
                              int64_t numel,
                              uint32_t key,
                              uint32_t counter_low) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i key_lanes = _mm512_set1_epi32(static_cast<int>(key));
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i infinity = _mm512_set1_epi32(0x7f800000);
  for (int64_t i = 0; i < numel; i += kLanes) {
    const __mmask16 mask = tail_mask(numel - i);
    const __m512i bits = _mm512_maskz_loadu_epi32(mask, in + i);
    const __m512i counter = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(counter_low + static_cast<uint32_t>(i))), iota);
    const __m512i noise = _mm512_srli_epi32(mix32(_mm512_xor_si512(counter, key_lanes)), 16);
    const __mmask16 finite = _mm512_cmplt_epu32_mask(_mm512_and_si512(bits, magnitude), infinity);
    const __m512i sum = _mm512_mask_add_epi32(bits, finite, bits, noise);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, magnitude), infinity);
    const __m512i rounded = _mm512_mask_mov_epi32(_mm512_srli_epi32(sum, 16), nan,
                                                  _mm512_set1_epi32(kBf16Nan));
    _mm256_mask_storeu_epi16(out + i, mask, _mm512_cvtepi32_epi16(rounded));
  }
}

}  // namespace

bool cast(const void* src,
          void* dst,
          int64_t numel,
          const CastOptions& options,
          bool use_bf16_instruction) {
  return options.check_nonfinite
             ? dispatch<true>(src, dst, numel, options.src, options.dst, use_bf16_instruction)
             : dispatch<false>(src, dst, numel, options.src, options.dst, use_bf16_instruction);
}

void cast_float_to_bf16_stochastic(const float* src,
                                   uint16_t* dst,
                                   int64_t numel,
                                   const StochasticOptions& options) {
  const auto* in = reinterpret_cast<const uint32_t*>(src);
  for_each_counter_run(options.seed, options.counter_base, numel,
                       [&](int64_t begin, int64_t end, uint32_t key, uint32_t counter_low) {
                         stochastic_run(in + begin, dst + begin, end - begin, key, counter_low);
                       });
}

}  // namespace shardwise::precision::avx512

#else  // not x86-64: never called, since detected_cpu_isa() is kScalar there.

#include <stdexcept>

namespace shardwise::precision::avx512 {
bool cast(const void*, void*, int64_t, const CastOptions&, bool) {
  throw std::logic_error("AVX-512 kernels are not compiled for this architecture");
}
void cast_float_to_bf16_stochastic(const float*, uint16_t*, int64_t, const StochasticOptions&) {
  throw std::logic_error("AVX-512 kernels are not compiled for this architecture");
}
}  // namespace shardwise::precision::avx512

#endif
