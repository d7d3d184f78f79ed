// Torch-free fused optimizer steps on flat float32 arrays: AdamW and SGD with momentum, one pass
// over each array that reads the gradient (float32, bfloat16 or float16), updates the parameter
// and the optimizer state in place and, when `low_precision` is not null, also writes the
// parameter rounded to bfloat16 or float16 (the low-precision copy). Per-element arithmetic:
// optim_math.h. CPU entry points run the scalar loop or the AVX-512 one (bit-identical), chosen by
// the caller's CpuIsa (common/cpu_features.h); CUDA launchers exist when built with CUDA.
#pragma once

#include <cstdint>

#include "common/cpu_features.h"
#include "optim/optim_math.h"

namespace shardwise::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  int64_t step = 1;         // this step's number, counted from 1 (after torch's `step += 1`)
  double grad_scale = 1.0;  // multiplies each gradient first (unscaling, clipping)
};

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = true;  // the momentum buffer is initialised to the gradient, as torch does
  double grad_scale = 1.0;
};

// One parameter's arrays, `count` elements each (contiguous, not overlapping).
struct AdamWSpan {
  float* param = nullptr;
  const void* grad = nullptr;
  Format grad_format = Format::kFloat32;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  void* low_precision = nullptr;  // null: no low-precision copy
  Format low_precision_format = Format::kBFloat16;
  int64_t count = 0;
};

struct SgdSpan {
  float* param = nullptr;
  const void* grad = nullptr;
  Format grad_format = Format::kFloat32;
  float* momentum_buffer = nullptr;  // null when momentum == 0
  void* low_precision = nullptr;
  Format low_precision_format = Format::kBFloat16;
  int64_t count = 0;
};

// Elements [begin, begin + count) of a span (for splitting one array across threads).
AdamWSpan slice(const AdamWSpan& span, int64_t begin, int64_t count);
SgdSpan slice(const SgdSpan& span, int64_t begin, int64_t count);

// The float32 scalars of a step, derived in double as torch.optim does (capturable=False).
// Throw std::invalid_argument on a step below 1 or a beta outside [0, 1).
AdamWScalars adamw_scalars(const AdamWOptions& options);
SgdScalars sgd_scalars(const SgdOptions& options);

// One step over `count` spans.
void fused_adamw_cpu(const AdamWSpan* spans,
                     int64_t count,
                     const AdamWScalars& scalars,
                     CpuIsa isa);
void fused_sgd_cpu(const SgdSpan* spans, int64_t count, const SgdScalars& scalars, CpuIsa isa);

// CUDA launchers (compiled only with CUDA): `spans` in host memory, pointing to device arrays;
// every span must have the same grad and low-precision formats. `stream` is a cudaStream_t.
void fused_adamw_cuda(const AdamWSpan* spans,
                      int64_t count,
                      const AdamWScalars& scalars,
                      void* stream);
void fused_sgd_cuda(const SgdSpan* spans, int64_t count, const SgdScalars& scalars, void* stream);

}  // namespace shardwise::optim
