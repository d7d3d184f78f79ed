// Torch-free cast kernels on raw contiguous arrays: the CPU entry points (dispatched at run time
// to the best instruction set, see common/cpu_features.h) and the CUDA launchers.
//
// Supported conversions: float32 -> bfloat16, float32 -> float16 (round to nearest even),
// bfloat16 -> float32, float16 -> float32 (exact), and float32 -> bfloat16 with stochastic
// rounding. Per-element semantics are defined once, in cast_math.h.
#pragma once

#include <cstdint>

#include "common/cpu_features.h"

namespace shardwise::precision {

enum class Format : uint8_t { kFloat32, kBFloat16, kFloat16 };

const char* format_name(Format format);

// True for the four conversions listed above.
bool is_supported_cast(Format src, Format dst);

struct CastOptions {
  Format src = Format::kFloat32;
  Format dst = Format::kBFloat16;
  // Also report whether any output element is Inf or NaN (an Inf/NaN input, or a float16
  // overflow), computed in the same pass.
  bool check_nonfinite = false;
};

struct StochasticOptions {
  uint64_t seed = 0;
  // Element i draws its noise from counter `counter_base + i`: a caller that casts one large
  // array in pieces passes each piece's offset and gets the result of a single call.
  uint64_t counter_base = 0;
};

// Casts `numel` elements from `src` to `dst` (contiguous, not overlapping). Returns true when
// `options.check_nonfinite` is set and an output element is Inf or NaN; false otherwise.
bool cast_cpu(const void* src, void* dst, int64_t numel, const CastOptions& options, CpuIsa isa);

// float32 -> bfloat16 with stochastic rounding (see cast_math.h).
void cast_float_to_bf16_stochastic_cpu(
    const float* src, uint16_t* dst, int64_t numel, const StochasticOptions& options, CpuIsa isa);

// One array of a multi-tensor cast.
struct CastSpan {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t numel = 0;
};

// CUDA launchers (compiled only with CUDA). `stream` is a cudaStream_t. When `nonfinite_flag` is
// not null it must point to device memory holding 0; the kernel stores 1 there if any output
// element is Inf or NaN. The multi-tensor form casts every span in as few launches as possible.
void cast_cuda(const CastSpan& span,
               const CastOptions& options,
               int32_t* nonfinite_flag,
               void* stream);
void cast_many_cuda(const CastSpan* spans,
                    int64_t count,
                    const CastOptions& options,
                    int32_t* nonfinite_flag,
                    void* stream);
void cast_float_to_bf16_stochastic_cuda(
    const float* src, uint16_t* dst, int64_t numel, const StochasticOptions& options, void* stream);

}  // namespace shardwise::precision
