// CUDA fused AdamW / SGD steps, torch-free: every thread updates elements with adamw_element /
// sgd_element of optim_math.h (explicit fmaf and __fmul_rn, so nvcc's FMA contraction changes
// nothing), so the CPU tests of those functions cover what runs here.
//
// Multi-tensor: one launch covers up to kMaxSpans spans passed by value in the kernel arguments;
// blockIdx.y selects the span, a grid-stride loop in x covers its elements. The grad and
// low-precision formats are template parameters (the same for every span of a call).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "optim/fused_optim.h"

namespace shardwise::optim {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
constexpr int kMaxSpans = 32;  // keeps the kernel arguments well under 4 KiB

template <typename Span>
struct SpanBatch {
  Span spans[kMaxSpans];
};

template <Format kFormat>
__device__ __forceinline__ float load_grad(const void* grad, int64_t i) {
  return load_widened(grad, i, kFormat);
}

template <Format kLow>
__device__ __forceinline__ void store_low(void* out, int64_t i, float value) {
  if constexpr (kLow != Format::kFloat32) {
    static_cast<uint16_t*>(out)[i] = round_low_precision(value, kLow);
  }
}

template <Format kGrad, Format kLow>
__global__ void adamw_kernel(SpanBatch<AdamWSpan> batch, AdamWScalars s) {
  const AdamWSpan& span = batch.spans[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < span.count;
       i += stride) {
    float param = span.param[i], exp_avg = span.exp_avg[i], exp_avg_sq = span.exp_avg_sq[i];
    adamw_element(param, exp_avg, exp_avg_sq, load_grad<kGrad>(span.grad, i), s);
    span.param[i] = param;
    span.exp_avg[i] = exp_avg;
    span.exp_avg_sq[i] = exp_avg_sq;
    store_low<kLow>(span.low_precision, i, param);
  }
}

template <Format kGrad, Format kLow>
__global__ void sgd_kernel(SpanBatch<SgdSpan> batch, SgdScalars s) {
  const SgdSpan& span = batch.spans[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < span.count;
       i += stride) {
    float param = span.param[i];
    float buffer = s.use_momentum && !s.first_step ? span.momentum_buffer[i] : 0.0f;
    sgd_element(param, buffer, load_grad<kGrad>(span.grad, i), s);
    span.param[i] = param;
    if (s.use_momentum) span.momentum_buffer[i] = buffer;
    store_low<kLow>(span.low_precision, i, param);
  }
}

unsigned blocks_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("shardwise: launching ") + what +
                             " failed: " + cudaGetErrorString(error));
  }
}

struct LaunchAdamW {
  const SpanBatch<AdamWSpan>& batch;
  dim3 grid;
  const AdamWScalars& s;
  cudaStream_t stream;
  template <Format kGrad, Format kLow>
  void launch() const {
    adamw_kernel<kGrad, kLow><<<grid, kThreads, 0, stream>>>(batch, s);
  }
};

struct LaunchSgd {
  const SpanBatch<SgdSpan>& batch;
  dim3 grid;
  const SgdScalars& s;
  cudaStream_t stream;
  template <Format kGrad, Format kLow>
  void launch() const {
    sgd_kernel<kGrad, kLow><<<grid, kThreads, 0, stream>>>(batch, s);
  }
};

template <Format kGrad, typename Launcher>
void with_low(Format low, const Launcher& fn) {
  if (low == Format::kBFloat16) {
    fn.template launch<kGrad, Format::kBFloat16>();
  } else if (low == Format::kFloat16) {
    fn.template launch<kGrad, Format::kFloat16>();
  } else {
    fn.template launch<kGrad, Format::kFloat32>();
  }
}

// Calls launcher.launch<kGrad, kLow>() for the formats of `span` (kLow = kFloat32: no copy).
template <typename Span, typename Launcher>
void dispatch_formats(const Span& span, const Launcher& fn) {
  const Format low = span.low_precision == nullptr ? Format::kFloat32 : span.low_precision_format;
  if (span.grad_format == Format::kBFloat16) {
    with_low<Format::kBFloat16>(low, fn);
  } else if (span.grad_format == Format::kFloat16) {
    with_low<Format::kFloat16>(low, fn);
  } else {
    with_low<Format::kFloat32>(low, fn);
  }
}

// Launches `make_launcher(batch, grid)` for each group of up to kMaxSpans spans.
template <typename Span, typename MakeLauncher>
void for_each_batch(const Span* spans, int64_t count, const MakeLauncher& make_launcher) {
  for (int64_t first = 0; first < count; first += kMaxSpans) {
    SpanBatch<Span> batch{};
    const int64_t n = count - first < kMaxSpans ? count - first : kMaxSpans;
    int64_t largest = 0;
    for (int64_t i = 0; i < n; ++i) {
      batch.spans[i] = spans[first + i];
      largest = spans[first + i].count > largest ? spans[first + i].count : largest;
    }
    if (largest == 0) continue;
    const dim3 grid(blocks_for(largest), static_cast<unsigned>(n));
    dispatch_formats(batch.spans[0], make_launcher(batch, grid));
  }
}

}  // namespace

void fused_adamw_cuda(const AdamWSpan* spans,
                      int64_t count,
                      const AdamWScalars& scalars,
                      void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_batch(spans, count, [&](const SpanBatch<AdamWSpan>& batch, dim3 grid) {
    return LaunchAdamW{batch, grid, scalars, cuda_stream};
  });
  check_launch("adamw_kernel");
}

void fused_sgd_cuda(const SgdSpan* spans, int64_t count, const SgdScalars& scalars, void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_batch(spans, count, [&](const SpanBatch<SgdSpan>& batch, dim3 grid) {
    return LaunchSgd{batch, grid, scalars, cuda_stream};
  });
  check_launch("sgd_kernel");
}

}  // namespace shardwise::optim
