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
  const __mmask16 nan =
      _mm512_cmp_ps_mask(_mm512_castsi512_ps(bits), _mm512_castsi512_ps(bits), _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(kBf16Nan));
}

SW_AVX512 inline __mmask16 exponent_all_ones(__m512i lanes, int exponent_mask) {
  const __m512i mask = _mm512_set1_epi32(exponent_mask);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(lanes, mask), mask);
}

// Loads and stores: plain ones for full vectors, masked ones only for the tail (masked stores
// are slow on some CPUs, e.g. AMD Zen 4).
template <bool kTail>
SW_AVX512 inline __m512i load_32bit(const void* p, __mmask16 mask) {
  return kTail ? _mm512_maskz_loadu_epi32(mask, p) : _mm512_loadu_si512(p);
}

template <bool kTail>
SW_AVX512 inline __m256i load_16bit(const void* p, __mmask16 mask) {
  return kTail ? _mm256_maskz_loadu_epi16(mask, p)
               : _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

template <bool kTail>
SW_AVX512 inline void store_16bit(void* p, __mmask16 mask, __m256i value) {
  if (kTail) {
    _mm256_mask_storeu_epi16(p, mask, value);
  } else {
    _mm256_storeu_si256(static_cast<__m256i*>(p), value);
  }
}

template <bool kTail>
SW_AVX512 inline void store_32bit(void* p, __mmask16 mask, __m512i value) {
  if (kTail) {
    _mm512_mask_storeu_epi32(p, mask, value);
  } else {
    _mm512_storeu_si512(p, value);
  }
}

// Runs kernel.step<kTail>(i, mask) over [0, numel) in steps of 16 lanes, the tail masked.
template <typename Kernel>
SW_AVX512 inline void for_each_vector(Kernel& kernel, int64_t numel) {
  int64_t i = 0;
  for (; i + kLanes <= numel; i += kLanes) {
    kernel.template step<false>(i, static_cast<__mmask16>(0xffff));
  }
  if (i < numel) {
    kernel.template step<true>(i, tail_mask(numel - i));
  }
}

template <bool kCheck>
struct FloatToBf16 {
  const uint32_t* in;
  uint16_t* out;
  __mmask16 nonfinite = 0;

  template <bool kTail>
  SW_AVX512 void step(int64_t i, __mmask16 mask) {
    const __m512i rounded = float_to_bf16_rne(load_32bit<kTail>(in + i, mask));
    if (kCheck) {
      nonfinite |= exponent_all_ones(rounded, 0x7f80) & mask;
    }
    store_16bit<kTail>(out + i, mask, _mm512_cvtepi32_epi16(rounded));
  }
};

// vcvtne2ps2bf16 converts 32 floats per step (two vectors) into one 512-bit store; a step that
// holds a denormal, Inf or NaN (the lanes the instruction gets wrong) or the tail falls back to
// the integer form 16 lanes at a time.
template <bool kCheck>
struct FloatToBf16Instruction {
  const uint32_t* in;
  uint16_t* out;
  __mmask16 nonfinite = 0;

  SW_AVX512_BF16 static __mmask16 special_lanes(__m512i bits) {
    const __mmask16 zero_exponent = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f800000));
    const __mmask16 denormal =
        _mm512_mask_test_epi32_mask(zero_exponent, bits, _mm512_set1_epi32(0x007fffff));
    return denormal | exponent_all_ones(bits, 0x7f800000);
  }

  SW_AVX512_BF16 void run(int64_t numel) {
    FloatToBf16<kCheck> fallback{in, out};
    __mmask32 wide_nonfinite = 0;
    int64_t i = 0;
    for (; i + 2 * kLanes <= numel; i += 2 * kLanes) {
      const __m512i low = _mm512_loadu_si512(in + i);
      const __m512i high = _mm512_loadu_si512(in + i + kLanes);
      if ((special_lanes(low) | special_lanes(high)) == 0) {
        const __m512i packed =
            (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(high), _mm512_castsi512_ps(low));
        if (kCheck) {  // finite inputs can still round up to Inf
          const __m512i exp16 = _mm512_set1_epi16(0x7f80);
          wide_nonfinite |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(packed, exp16), exp16);
        }
        _mm512_storeu_si512(out + i, packed);
      } else {
        fallback.template step<false>(i, static_cast<__mmask16>(0xffff));
        fallback.template step<false>(i + kLanes, static_cast<__mmask16>(0xffff));
      }
    }
    for (; i < numel; i += kLanes) {
      const int64_t remaining = numel - i;
      if (remaining >= kLanes) {
        fallback.template step<false>(i, static_cast<__mmask16>(0xffff));
      } else {
        fallback.template step<true>(i, tail_mask(remaining));
      }
    }
    nonfinite = fallback.nonfinite | (wide_nonfinite != 0 ? 1 : 0);
  }
};

template <bool kCheck>
struct FloatToHalf {
  const uint32_t* in;
  uint16_t* out;
  __mmask16 nonfinite = 0;

  template <bool kTail>
  SW_AVX512 void step(int64_t i, __mmask16 mask) {
    const __m256i packed = _mm512_cvtps_ph(_mm512_castsi512_ps(load_32bit<kTail>(in + i, mask)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (kCheck) {
      const __m256i exp16 = _mm256_set1_epi16(0x7c00);
      nonfinite |= _mm256_cmpeq_epi16_mask(_mm256_and_si256(packed, exp16), exp16) & mask;
    }
    store_16bit<kTail>(out + i, mask, packed);
  }
};

template <bool kCheck, bool kFromHalf>
struct WidenToFloat {
  const uint16_t* in;
  uint32_t* out;
  __mmask16 nonfinite = 0;

  template <bool kTail>
  SW_AVX512 void step(int64_t i, __mmask16 mask) {
    const __m256i narrow = load_16bit<kTail>(in + i, mask);
    const __m512i wide = kFromHalf ? _mm512_castps_si512(_mm512_cvtph_ps(narrow))
                                   : _mm512_slli_epi32(_mm512_cvtepu16_epi32(narrow), 16);
    if (kCheck) {
      nonfinite |= exponent_all_ones(wide, 0x7f800000) & mask;
    }
    store_32bit<kTail>(out + i, mask, wide);
  }
};

template <typename Kernel>
bool run(Kernel kernel, int64_t numel) {
  for_each_vector(kernel, numel);
  return kernel.nonfinite != 0;
}

template <bool kCheck>
bool dispatch(const void* src, void* dst, int64_t numel, Format from, Format to, bool bf16_insn) {
  if (from == Format::kFloat32) {
    const auto* in = static_cast<const uint32_t*>(src);
    auto* out = static_cast<uint16_t*>(dst);
    if (to == Format::kFloat16) {
      return run(FloatToHalf<kCheck>{in, out}, numel);
    }
    if (bf16_insn) {
      FloatToBf16Instruction<kCheck> kernel{in, out};
      kernel.run(numel);
      return kernel.nonfinite != 0;
    }
    return run(FloatToBf16<kCheck>{in, out}, numel);
  }
  const auto* in = static_cast<const uint16_t*>(src);
  auto* out = static_cast<uint32_t*>(dst);
  return from == Format::kFloat16 ? run(WidenToFloat<kCheck, true>{in, out}, numel)
                                  : run(WidenToFloat<kCheck, false>{in, out}, numel);
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
struct StochasticRun {
  const uint32_t* in;
  uint16_t* out;
  uint32_t key;
  uint32_t counter_low;

  template <bool kTail>
  SW_AVX512 void step(int64_t i, __mmask16 mask) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    const __m512i infinity = _mm512_set1_epi32(0x7f800000);
    const __m512i bits = load_32bit<kTail>(in + i, mask);
    const __m512i counter = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(counter_low + static_cast<uint32_t>(i))), iota);
    const __m512i noise = _mm512_srli_epi32(
        mix32(_mm512_xor_si512(counter, _mm512_set1_epi32(static_cast<int>(key)))), 16);
    const __m512i abs_bits = _mm512_and_si512(bits, magnitude);
    const __mmask16 finite = _mm512_cmplt_epu32_mask(abs_bits, infinity);
    const __m512i sum = _mm512_mask_add_epi32(bits, finite, bits, noise);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs_bits, infinity);
    const __m512i rounded =
        _mm512_mask_mov_epi32(_mm512_srli_epi32(sum, 16), nan, _mm512_set1_epi32(kBf16Nan));
    store_16bit<kTail>(out + i, mask, _mm512_cvtepi32_epi16(rounded));
  }
};

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
                         StochasticRun kernel{in + begin, dst + begin, key, counter_low};
                         for_each_vector(kernel, end - begin);
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
