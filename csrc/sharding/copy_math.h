// Per-element semantics of the sharding copies, shared by the CPU loops and the CUDA kernel (so
// the CPU tests cover what runs on the GPU): load an element as the compute type, scale it,
// optionally add the destination, store it rounded to nearest even.
//
// The compute type is float32 unless either side is float64 (then float64); this is what torch
// does for `src.to(dst_dtype) * scale` (bf16/fp16 arithmetic runs in float32) and for
// `dst += src.to(dst.dtype) * scale`.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/macros.h"
#include "precision/cast_math.h"

namespace shardwise::sharding {

enum class Element : uint8_t { kFloat32, kFloat64, kBFloat16, kFloat16 };

template <Element kElement>
struct ElementTraits;

template <>
struct ElementTraits<Element::kFloat32> {
  using Storage = float;
  SW_HOST_DEVICE SW_INLINE static float load(Storage v) { return v; }
  SW_HOST_DEVICE SW_INLINE static Storage store(float v) { return v; }
  SW_HOST_DEVICE SW_INLINE static Storage store(double v) { return static_cast<float>(v); }
};

template <>
struct ElementTraits<Element::kFloat64> {
  using Storage = double;
  SW_HOST_DEVICE SW_INLINE static double load(Storage v) { return v; }
  SW_HOST_DEVICE SW_INLINE static Storage store(double v) { return v; }
};

template <>
struct ElementTraits<Element::kBFloat16> {
  using Storage = uint16_t;
  SW_HOST_DEVICE SW_INLINE static float load(Storage v) {
    return precision::bits_float(precision::bf16_to_float_bits(v));
  }
  SW_HOST_DEVICE SW_INLINE static Storage store(float v) {
    return precision::float_to_bf16_bits(precision::float_bits(v));
  }
  SW_HOST_DEVICE SW_INLINE static Storage store(double v) {  // as torch: double -> float -> bf16
    return store(static_cast<float>(v));
  }
};

template <>
struct ElementTraits<Element::kFloat16> {
  using Storage = uint16_t;
  SW_HOST_DEVICE SW_INLINE static float load(Storage v) {
    return precision::bits_float(precision::half_to_float_bits(v));
  }
  SW_HOST_DEVICE SW_INLINE static Storage store(float v) {
    return precision::float_to_half_bits(precision::float_bits(v));
  }
  SW_HOST_DEVICE SW_INLINE static Storage store(double v) { return store(static_cast<float>(v)); }
};

// float64 when either side is float64, else float32.
template <Element kSrc, Element kDst>
using ComputeType = typename std::
    conditional<kSrc == Element::kFloat64 || kDst == Element::kFloat64, double, float>::type;

// dst = round(load(src) * scale), or round(load(dst) + load(src) * scale) when accumulating.
template <Element kSrc, Element kDst, bool kAccumulate>
SW_HOST_DEVICE SW_INLINE typename ElementTraits<kDst>::Storage copy_element(
    typename ElementTraits<kSrc>::Storage src,
    typename ElementTraits<kDst>::Storage dst,
    ComputeType<kSrc, kDst> scale) {
  using Compute = ComputeType<kSrc, kDst>;
  Compute value = static_cast<Compute>(ElementTraits<kSrc>::load(src)) * scale;
  if (kAccumulate) value = static_cast<Compute>(ElementTraits<kDst>::load(dst)) + value;
  return ElementTraits<kDst>::store(value);
}

}  // namespace shardwise::sharding
