// Portable CPU cast kernels and the run-time dispatch to the AVX-512 ones.
//
// The scalar kernels are plain loops over the per-element functions of cast_math.h; the compiler
// may vectorise them for the baseline instruction set. `cast_cpu` sends a call to the AVX-512
// kernels when the active instruction set allows it (see common/cpu_features.h).
#include <stdexcept>

#include "precision/cast_cpu_avx512.h"
#include "precision/cast_kernels.h"
#include "precision/cast_math.h"

namespace shardwise::precision {
namespace {

// Applies `convert` (input bits -> output bits) to every element; `is_nonfinite` tests an output.
template <typename In, typename Out, typename Convert, typename IsNonfinite>
bool convert_loop(const void* src,
                  void* dst,
                  int64_t numel,
                  bool check_nonfinite,
                  Convert convert,
                  IsNonfinite is_nonfinite) {
  const In* in = static_cast<const In*>(src);
  Out* out = static_cast<Out*>(dst);
  if (!check_nonfinite) {
    for (int64_t i = 0; i < numel; ++i) {
      out[i] = convert(in[i]);
    }
    return false;
  }
  bool nonfinite = false;
  for (int64_t i = 0; i < numel; ++i) {
    out[i] = convert(in[i]);
    nonfinite |= is_nonfinite(out[i]);
  }
  return nonfinite;
}

bool cast_scalar(const void* src, void* dst, int64_t numel, const CastOptions& options) {
  const bool check = options.check_nonfinite;
  if (options.src == Format::kFloat32 && options.dst == Format::kBFloat16) {
    return convert_loop<uint32_t, uint16_t>(src, dst, numel, check, float_to_bf16_bits,
                                            bf16_is_nonfinite);
  }
  if (options.src == Format::kFloat32 && options.dst == Format::kFloat16) {
    return convert_loop<uint32_t, uint16_t>(src, dst, numel, check, float_to_half_bits,
                                            half_is_nonfinite);
  }
  if (options.src == Format::kBFloat16 && options.dst == Format::kFloat32) {
    return convert_loop<uint16_t, uint32_t>(src, dst, numel, check, bf16_to_float_bits,
                                            float_is_nonfinite);
  }
  return convert_loop<uint16_t, uint32_t>(src, dst, numel, check, half_to_float_bits,
                                          float_is_nonfinite);
}

}  // namespace

const char* format_name(Format format) {
  switch (format) {
    case Format::kFloat32:
      return "float32";
    case Format::kBFloat16:
      return "bfloat16";
    case Format::kFloat16:
      return "float16";
  }
  return "unknown";
}

bool is_supported_cast(Format src, Format dst) {
  return (src == Format::kFloat32) != (dst == Format::kFloat32);
}

bool cast_cpu(const void* src, void* dst, int64_t numel, const CastOptions& options, CpuIsa isa) {
  if (!is_supported_cast(options.src, options.dst)) {
    throw std::invalid_argument(std::string("unsupported cast from ") + format_name(options.src) +
                                " to " + format_name(options.dst));
  }
  if (numel <= 0) {
    return false;
  }
  if (isa >= CpuIsa::kAvx512) {
    return avx512::cast(src, dst, numel, options, isa == CpuIsa::kAvx512Bf16);
  }
  return cast_scalar(src, dst, numel, options);
}

void cast_float_to_bf16_stochastic_cpu(
    const float* src, uint16_t* dst, int64_t numel, const StochasticOptions& options, CpuIsa isa) {
  if (numel <= 0) {
    return;
  }
  if (isa >= CpuIsa::kAvx512) {
    avx512::cast_float_to_bf16_stochastic(src, dst, numel, options);
    return;
  }
  const uint32_t* in = reinterpret_cast<const uint32_t*>(src);
  for_each_counter_run(options.seed, options.counter_base, numel,
                       [&](int64_t begin, int64_t end, uint32_t key, uint32_t counter_low) {
                         for (int64_t i = begin; i < end; ++i) {
                           const uint32_t noise = stochastic_noise(
                               key, counter_low + static_cast<uint32_t>(i - begin));
                           dst[i] = float_to_bf16_stochastic_bits(in[i], noise);
                         }
                       });
}

}  // namespace shardwise::precision
