// The casting ops for LibTorch users. Each call goes through the dispatcher (so autograd,
// CPU/CUDA selection and torch.compile all apply), exactly like torch.ops.shardwise.* in Python.
//
//   at::Tensor w16 = shardwise::cast(w32, at::kBFloat16);            // round to nearest even
//   at::Tensor sr = shardwise::cast_stochastic_bf16(w32, /*seed=*/1, /*offset=*/0);
//   auto [g16, found_nonfinite] = shardwise::cast_check_finite(g32, at::kHalf);
//   at::Tensor any_nonfinite = shardwise::multi_cast_(inputs, outputs);
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

namespace shardwise {

// float32 -> bfloat16/float16 (round to nearest even) or bfloat16/float16 -> float32.
at::Tensor cast(const at::Tensor& input, at::ScalarType dtype);

// float32 -> bfloat16 with stochastic rounding; element i uses counter `offset + i` of `seed`.
at::Tensor cast_stochastic_bf16(const at::Tensor& input, int64_t seed, int64_t offset = 0);

// `cast` that also returns a 0-dim bool tensor (on the input's device, no synchronisation): true
// when an output element is Inf or NaN.
std::tuple<at::Tensor, at::Tensor> cast_check_finite(const at::Tensor& input, at::ScalarType dtype);

// Casts inputs[i] into outputs[i] (same shape; the output's dtype selects the conversion) for
// every i in one call; returns a 0-dim bool tensor: whether any output element is Inf or NaN.
at::Tensor multi_cast_(at::TensorList inputs, at::TensorList outputs);

}  // namespace shardwise
