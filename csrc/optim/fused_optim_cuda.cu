// CUDA fused AdamW / SGD / LAMB steps, torch-free: every thread updates elements with the
// per-element functions of optim_math.h (explicit fmaf and __fmul_rn, so nvcc's FMA contraction
// changes nothing), so the CPU tests of those functions cover what runs here.
//
// Multi-tensor: one launch covers up to kMaxSpans spans passed by value in the kernel arguments;
// blockIdx.y selects the span, a grid-stride loop in x covers its elements. The grad and
// low-precision formats are template parameters (the same for every span of a call).
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "optim/fused_optim.h"
#include "optim/lamb.h"

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

// LAMB pass 1: each block of span blockIdx.y sums param^2 and direction^2 over its grid-stride
// elements, reduces them in shared memory, and writes them to its slot of `partials`.
template <Format kGrad, Format kLow>
__global__ void lamb_moments_kernel(SpanBatch<LambSpan> batch, LambScalars s, double* partials) {
  const LambSpan& span = batch.spans[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double sums[2] = {0.0, 0.0};
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < span.count;
       i += stride) {
    const float param = span.param[i];
    float exp_avg = span.exp_avg[i], exp_avg_sq = span.exp_avg_sq[i];
    const float direction =
        lamb_moments_element(param, exp_avg, exp_avg_sq, load_grad<kGrad>(span.grad, i), s);
    span.exp_avg[i] = exp_avg;
    span.exp_avg_sq[i] = exp_avg_sq;
    sums[0] += static_cast<double>(param) * param;
    sums[1] += static_cast<double>(direction) * direction;
  }
  __shared__ double shared[2][kThreads];
  for (int k = 0; k < 2; ++k) shared[k][threadIdx.x] = sums[k];
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      for (int k = 0; k < 2; ++k) shared[k][threadIdx.x] += shared[k][threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    double* out = partials + 2 * (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x);
    out[0] = shared[0][0];
    out[1] = shared[1][0];
  }
}

// Each span's block sums added up in block order (one thread per span).
__global__ void lamb_sum_partials_kernel(const double* partials, int64_t spans, double* squares) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= spans) return;
  double sums[2] = {0.0, 0.0};
  for (int b = 0; b < kLambBlocks; ++b) {
    sums[0] += partials[2 * (k * kLambBlocks + b)];
    sums[1] += partials[2 * (k * kLambBlocks + b) + 1];
  }
  squares[2 * k] = sums[0];
  squares[2 * k + 1] = sums[1];
}

// LAMB pass 3.
template <Format kGrad, Format kLow>
__global__ void lamb_apply_kernel(SpanBatch<LambSpan> batch, LambScalars s, const float* steps) {
  const LambSpan& span = batch.spans[blockIdx.y];
  const float scaled_step = steps[blockIdx.y];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < span.count;
       i += stride) {
    float param = span.param[i];
    lamb_apply_element(param, span.exp_avg[i], span.exp_avg_sq[i], scaled_step, s);
    span.param[i] = param;
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

struct LaunchLambMoments {
  const SpanBatch<LambSpan>& batch;
  const LambScalars& s;
  double* partials;  // this batch's
  cudaStream_t stream;
  template <Format kGrad, Format kLow>
  void launch() const {
    const dim3 grid(kLambBlocks, batch_size);
    lamb_moments_kernel<kGrad, kLow><<<grid, kThreads, 0, stream>>>(batch, s, partials);
  }
  unsigned batch_size;
};

struct LaunchLambApply {
  const SpanBatch<LambSpan>& batch;
  dim3 grid;
  const LambScalars& s;
  const float* steps;  // this batch's
  cudaStream_t stream;
  template <Format kGrad, Format kLow>
  void launch() const {
    lamb_apply_kernel<kGrad, kLow><<<grid, kThreads, 0, stream>>>(batch, s, steps);
  }
};

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

// Launches `make_launcher(batch, grid, first)` for each group of up to kMaxSpans spans (the
// first's index in `spans`); with `every`, groups of empty spans too.
template <typename Span, typename MakeLauncher>
void for_each_batch(const Span* spans,
                    int64_t count,
                    const MakeLauncher& make_launcher,
                    bool every = false) {
  for (int64_t first = 0; first < count; first += kMaxSpans) {
    SpanBatch<Span> batch{};
    const int64_t n = count - first < kMaxSpans ? count - first : kMaxSpans;
    int64_t largest = 0;
    for (int64_t i = 0; i < n; ++i) {
      batch.spans[i] = spans[first + i];
      largest = spans[first + i].count > largest ? spans[first + i].count : largest;
    }
    if (largest == 0 && !every) continue;
    const dim3 grid(blocks_for(largest), static_cast<unsigned>(n));
    dispatch_formats(batch.spans[0], make_launcher(batch, grid, first));
  }
}

}  // namespace

void fused_adamw_cuda(const AdamWSpan* spans,
                      int64_t count,
                      const AdamWScalars& scalars,
                      void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_batch(spans, count, [&](const SpanBatch<AdamWSpan>& batch, dim3 grid, int64_t) {
    return LaunchAdamW{batch, grid, scalars, cuda_stream};
  });
  check_launch("adamw_kernel");
}

void fused_sgd_cuda(const SgdSpan* spans, int64_t count, const SgdScalars& scalars, void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_batch(spans, count, [&](const SpanBatch<SgdSpan>& batch, dim3 grid, int64_t) {
    return LaunchSgd{batch, grid, scalars, cuda_stream};
  });
  check_launch("sgd_kernel");
}

void lamb_moments_cuda(const LambSpan* spans,
                       int64_t count,
                       const LambScalars& scalars,
                       double* partials,
                       double* squares,
                       void* stream) {
  if (count == 0) return;
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_batch(
      spans, count,
      [&](const SpanBatch<LambSpan>& batch, dim3 grid, int64_t first) {
        return LaunchLambMoments{batch, scalars, partials + 2 * first * kLambBlocks, cuda_stream,
                                 grid.y};
      },
      /*every=*/true);  // an empty span's blocks write its zero sums
  check_launch("lamb_moments_kernel");
  const unsigned blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
  lamb_sum_partials_kernel<<<blocks, kThreads, 0, cuda_stream>>>(partials, count, squares);
  check_launch("lamb_sum_partials_kernel");
}

void lamb_apply_cuda(const LambSpan* spans,
                     int64_t count,
                     const LambScalars& scalars,
                     const float* scaled_steps,
                     void* stream) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  for_each_batch(spans, count, [&](const SpanBatch<LambSpan>& batch, dim3 grid, int64_t first) {
    return LaunchLambApply{batch, grid, scalars, scaled_steps + first, cuda_stream};
  });
  check_launch("lamb_apply_kernel");
}

}  // namespace shardwise::optim
