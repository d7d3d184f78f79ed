// CUDA cast kernels, torch-free: every thread converts elements with the functions of
// cast_math.h, so the CPU tests of those functions cover what runs here.
//
// cast_kernel: a grid-stride loop over one array. cast_many_kernel: the multi-tensor form;
// blockIdx.y selects one of up to kMaxSpans arrays passed by value in the kernel arguments, and
// the x dimension strides over that array. Where both of a span's pointers are 16-byte aligned,
// each thread moves kVec elements per step as 16-byte words (an 8-element pack of 2-byte values
// is one word, of 4-byte values two), and the numel % kVec tail element by element; an unaligned
// span goes element by element throughout. The non-finite flag is a device int that threads
// finding an Inf/NaN output set to 1 (all writers store the same value, so no atomics are needed).
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/vector_pack.cuh"
#include "precision/cast_kernels.h"
#include "precision/cast_math.h"

namespace shardwise::precision {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;
constexpr int kMaxSpans = 64;

struct SpanBatch {
  CastSpan spans[kMaxSpans];
};

constexpr int kVec = kPackElements;

// The bit types of a format pair: In for the source's elements, Out for the destination's.
template <Format kSrc, Format kDst>
struct Bits {
  using In = std::conditional_t<kSrc == Format::kFloat32, uint32_t, uint16_t>;
  using Out = std::conditional_t<kDst == Format::kFloat32, uint32_t, uint16_t>;
};

// One element: its output bits in `out`; returns whether the output is Inf or NaN.
template <Format kSrc, Format kDst>
__device__ __forceinline__ bool convert_bits(typename Bits<kSrc, kDst>::In in,
                                             typename Bits<kSrc, kDst>::Out& out) {
  if constexpr (kSrc == Format::kFloat32 && kDst == Format::kBFloat16) {
    out = float_to_bf16_bits(in);
    return bf16_is_nonfinite(out);
  } else if constexpr (kSrc == Format::kFloat32) {
    out = float_to_half_bits(in);
    return half_is_nonfinite(out);
  } else if constexpr (kSrc == Format::kBFloat16) {
    out = bf16_to_float_bits(in);
    return float_is_nonfinite(out);
  } else {
    out = half_to_float_bits(in);
    return float_is_nonfinite(out);
  }
}

// Pack `v` of a span (elements v * kVec ... v * kVec + kVec - 1), as 16-byte loads and stores.
template <Format kSrc, Format kDst>
__device__ __forceinline__ bool convert_pack(const CastSpan& span, int64_t v) {
  using In = typename Bits<kSrc, kDst>::In;
  using Out = typename Bits<kSrc, kDst>::Out;
  const Pack<In> in = load_pack(static_cast<const In*>(span.src), v);
  Pack<Out> out;
  bool nonfinite = false;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    nonfinite |= convert_bits<kSrc, kDst>(in.values[k], out.values[k]);
  }
  store_pack(static_cast<Out*>(span.dst), v, out);
  return nonfinite;
}

template <Format kSrc, Format kDst>
__device__ __forceinline__ bool convert_one(const CastSpan& span, int64_t i) {
  using In = typename Bits<kSrc, kDst>::In;
  using Out = typename Bits<kSrc, kDst>::Out;
  Out out;
  const bool nonfinite = convert_bits<kSrc, kDst>(static_cast<const In*>(span.src)[i], out);
  static_cast<Out*>(span.dst)[i] = out;
  return nonfinite;
}

template <Format kSrc, Format kDst>
__device__ __forceinline__ void cast_span(const CastSpan& span, int32_t* nonfinite_flag) {
  bool nonfinite = false;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;  // the first element cast one by one
  if (aligned16(span.src) && aligned16(span.dst)) {
    const int64_t packs = span.numel / kVec;
    for (int64_t v = first; v < packs; v += stride) {
      nonfinite |= convert_pack<kSrc, kDst>(span, v);
    }
    tail = packs * kVec;
  }
  for (int64_t i = tail + first; i < span.numel; i += stride) {
    nonfinite |= convert_one<kSrc, kDst>(span, i);
  }
  if (nonfinite && nonfinite_flag != nullptr) {
    *nonfinite_flag = 1;
  }
}

template <Format kSrc, Format kDst>
__global__ void cast_kernel(CastSpan span, int32_t* nonfinite_flag) {
  cast_span<kSrc, kDst>(span, nonfinite_flag);
}

template <Format kSrc, Format kDst>
__global__ void cast_many_kernel(SpanBatch batch, int32_t* nonfinite_flag) {
  cast_span<kSrc, kDst>(batch.spans[blockIdx.y], nonfinite_flag);
}

__device__ __forceinline__ uint16_t stochastic_one(uint32_t bits,
                                                   uint64_t counter,
                                                   const StochasticOptions& options) {
  const uint32_t key = stochastic_key(options.seed, static_cast<uint32_t>(counter >> 32));
  return float_to_bf16_stochastic_bits(bits, stochastic_noise(key, static_cast<uint32_t>(counter)));
}

// Element i draws counter counter_base + i; packs of kVec as in cast_span.
__global__ void stochastic_kernel(const uint32_t* src,
                                  uint16_t* dst,
                                  int64_t numel,
                                  StochasticOptions options) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (aligned16(src) && aligned16(dst)) {
    const int64_t packs = numel / kVec;
    for (int64_t v = first; v < packs; v += stride) {
      const Pack<uint32_t> in = load_pack(src, v);
      Pack<uint16_t> out;
      const uint64_t base = options.counter_base + static_cast<uint64_t>(v * kVec);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        out.values[k] = stochastic_one(in.values[k], base + k, options);
      }
      store_pack(dst, v, out);
    }
    tail = packs * kVec;
  }
  for (int64_t i = tail + first; i < numel; i += stride) {
    dst[i] = stochastic_one(src[i], options.counter_base + static_cast<uint64_t>(i), options);
  }
}

// Blocks for `numel` elements: one thread per pack of kVec (the tail needs no more threads).
unsigned blocks_for(int64_t numel) {
  const int64_t threads = (numel + kVec - 1) / kVec;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("shardwise: launching ") + what +
                             " failed: " + cudaGetErrorString(error));
  }
}

// Launches one kernel for a format pair chosen at compile time (C++17: no templated lambdas).
struct LaunchOne {
  const CastSpan& span;
  int32_t* flag;
  cudaStream_t stream;
  template <Format kSrc, Format kDst>
  void launch() const {
    cast_kernel<kSrc, kDst><<<blocks_for(span.numel), kThreads, 0, stream>>>(span, flag);
  }
};

struct LaunchMany {
  const SpanBatch& batch;
  dim3 grid;
  int32_t* flag;
  cudaStream_t stream;
  template <Format kSrc, Format kDst>
  void launch() const {
    cast_many_kernel<kSrc, kDst><<<grid, kThreads, 0, stream>>>(batch, flag);
  }
};

// Calls launcher.launch<kSrc, kDst>() for the runtime format pair.
template <typename Launcher>
void dispatch_formats(const CastOptions& options, const Launcher& fn) {
  if (!is_supported_cast(options.src, options.dst)) {
    throw std::invalid_argument(std::string("unsupported cast from ") + format_name(options.src) +
                                " to " + format_name(options.dst));
  }
  if (options.src == Format::kFloat32 && options.dst == Format::kBFloat16) {
    fn.template launch<Format::kFloat32, Format::kBFloat16>();
  } else if (options.src == Format::kFloat32) {
    fn.template launch<Format::kFloat32, Format::kFloat16>();
  } else if (options.src == Format::kBFloat16) {
    fn.template launch<Format::kBFloat16, Format::kFloat32>();
  } else {
    fn.template launch<Format::kFloat16, Format::kFloat32>();
  }
}

}  // namespace

void cast_cuda(const CastSpan& span,
               const CastOptions& options,
               int32_t* nonfinite_flag,
               void* stream) {
  if (span.numel <= 0) {
    return;
  }
  int32_t* flag = options.check_nonfinite ? nonfinite_flag : nullptr;
  dispatch_formats(options, LaunchOne{span, flag, static_cast<cudaStream_t>(stream)});
  check_launch("cast_kernel");
}

void cast_many_cuda(const CastSpan* spans,
                    int64_t count,
                    const CastOptions& options,
                    int32_t* nonfinite_flag,
                    void* stream) {
  int32_t* flag = options.check_nonfinite ? nonfinite_flag : nullptr;
  for (int64_t first = 0; first < count; first += kMaxSpans) {
    SpanBatch batch{};
    const int64_t n = count - first < kMaxSpans ? count - first : kMaxSpans;
    int64_t largest = 0;
    for (int64_t i = 0; i < n; ++i) {
      batch.spans[i] = spans[first + i];
      largest = spans[first + i].numel > largest ? spans[first + i].numel : largest;
    }
    if (largest == 0) {
      continue;
    }
    const dim3 grid(blocks_for(largest), static_cast<unsigned>(n));
    dispatch_formats(options, LaunchMany{batch, grid, flag, static_cast<cudaStream_t>(stream)});
    check_launch("cast_many_kernel");
  }
}

void cast_float_to_bf16_stochastic_cuda(const float* src,
                                        uint16_t* dst,
                                        int64_t numel,
                                        const StochasticOptions& options,
                                        void* stream) {
  if (numel <= 0) {
    return;
  }
  stochastic_kernel<<<blocks_for(numel), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const uint32_t*>(src), dst, numel, options);
  check_launch("stochastic_kernel");
}

}  // namespace shardwise::precision
