// AVX-512 cast kernels, compiled with function target attributes so the rest of the binary stays
// portable; called only when common/cpu_features.h reports support. Internal to cast_cpu.cc.
#pragma once

#include <cstdint>

#include "precision/cast_kernels.h"

namespace shardwise::precision::avx512 {

// `use_bf16_instruction` selects vcvtneps2bf16 (AVX512_BF16) for float32 -> bfloat16.
bool cast(const void* src,
          void* dst,
          int64_t numel,
          const CastOptions& options,
          bool use_bf16_instruction);

void cast_float_to_bf16_stochastic(const float* src,
                                   uint16_t* dst,
                                   int64_t numel,
                                   const StochasticOptions& options);

}  // namespace shardwise::precision::avx512
