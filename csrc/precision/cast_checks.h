// Argument checks shared by the CPU and CUDA implementations of the casting ops. Every error
// names the op, the argument and what to pass instead, and is raised before any work starts.
#pragma once

#include <ATen/core/Tensor.h>

#include "precision/cast_kernels.h"

namespace shardwise::precision {

// The kernel format of a tensor dtype; errors naming `op` and `argument` for other dtypes.
Format format_of(at::ScalarType dtype, const char* op, const char* argument);

// Checks that `input` can be cast to `dtype` and returns the kernel options.
CastOptions check_cast(const char* op, const at::Tensor& input, at::ScalarType dtype);

// Checks one (inputs[index], outputs[index]) pair of multi_cast_ against inputs[0]'s device.
CastOptions check_cast_pair(const at::Tensor& input,
                            const at::Tensor& output,
                            size_t index,
                            const at::Device& device);

// Checks the list lengths of multi_cast_.
void check_cast_lists(at::TensorList inputs, at::TensorList outputs);

// Checks the input of cast_stochastic_bf16.
void check_stochastic(const at::Tensor& input, int64_t offset);

}  // namespace shardwise::precision
