// LAMB (layer-wise adaptive moments, You et al. 2019) as DeepSpeed's FusedLamb computes it, on
// flat float32 arrays: torch-free, for the CPU (here) and CUDA (lamb_cuda.cu).
//
// A step is two passes over each parameter (or each piece of one, when it is sharded):
//   1. lamb_moments: exp_avg and exp_avg_sq updated with the gradient, and per span the sums of
//      param^2 and of direction^2, direction = exp_avg / denom + weight_decay * param
//      (denom = sqrt(exp_avg_sq) + eps, or sqrt(exp_avg_sq + eps) with eps_inside_sqrt);
//   2. between the passes the caller adds up each parameter's sums over its spans and over the
//      ranks holding its other pieces, and lamb_coefficient turns them into the trust ratio
//      ||param|| / ||direction||, clamped to [min_coeff, max_coeff] (1 where either is 0);
//   3. lamb_apply: param -= step_size * coefficient * direction, the direction recomputed from
//      the moments (no buffer), with the low-precision copy written in the same pass.
// step_size is lr, times sqrt(1 - beta2^step) / (1 - beta1^step) with bias_correction.
// Per-element arithmetic: optim_math.h.
#pragma once

#include <cstdint>

#include "optim/fused_optim.h"
#include "optim/optim_math.h"

namespace shardwise::optim {

struct LambOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.0;
  int64_t step = 1;  // this step's number, counted from 1
  bool bias_correction = true;
  bool eps_inside_sqrt = false;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  double grad_scale = 1.0;  // multiplies each gradient first (unscaling, clipping)
};

// LAMB's spans are AdamW's: param, grad, exp_avg, exp_avg_sq, low-precision copy.
using LambSpan = AdamWSpan;

// The float32 scalars of a step (derived in double, rounded once). Throws std::invalid_argument
// on a step below 1, a beta outside [0, 1), or min_coeff > max_coeff.
LambScalars lamb_scalars(const LambOptions& options);

// Pass 1 over `count` spans: squares[2 * i] += sum of param^2 and squares[2 * i + 1] += sum of
// direction^2 over span i (accumulated in double).
void lamb_moments_cpu(const LambSpan* spans,
                      int64_t count,
                      const LambScalars& scalars,
                      double* squares);

// The trust ratio of a parameter from its total sums of squares.
double lamb_coefficient(double param_squares, double direction_squares, const LambOptions& options);

// Pass 3 over `count` spans, span i scaled by scaled_steps[i] = step_size * its coefficient.
void lamb_apply_cpu(const LambSpan* spans,
                    int64_t count,
                    const LambScalars& scalars,
                    const float* scaled_steps);

// CUDA (compiled only with CUDA): `spans` in host memory pointing to device arrays, every span
// with the same grad and low-precision formats; in device memory `partials` (2 x
// kLambBlocks per span: each block's sums, added up in a fixed order so that a step is
// deterministic), `squares` (2 per span, set, not added to) and `scaled_steps` (1 per span);
// `stream` is a cudaStream_t.
constexpr int kLambBlocks = 64;
void lamb_moments_cuda(const LambSpan* spans,
                       int64_t count,
                       const LambScalars& scalars,
                       double* partials,
                       double* squares,
                       void* stream);
void lamb_apply_cuda(const LambSpan* spans,
                     int64_t count,
                     const LambScalars& scalars,
                     const float* scaled_steps,
                     void* stream);

}  // namespace shardwise::optim
