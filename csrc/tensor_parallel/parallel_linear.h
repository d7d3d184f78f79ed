// Column- and row-parallel linear layers (Megatron-style) over a tensor-parallel process group.
//
// column_parallel_linear: the weight is split on its output features (this rank holds
// [out / tp, in] and the matching bias slice). Forward needs no communication (the input is
// replicated) and returns this rank's slice of the output features. Backward computes the input
// gradient first, starts its all-reduce over the group asynchronously, computes the weight and
// bias gradients while it runs, then waits. With sequence_parallel the input arrives split along
// `sequence_dim`: forward all-gathers it (saving only the local slice), backward all-gathers it
// again while the input gradient is computed, then reduce-scatters the input gradient along the
// sequence while the weight gradient is computed. With save_gathered the gathered input is saved
// instead: one all-gather less per layer in backward for tp times the saved input's memory.
//
// row_parallel_linear: the weight is split on its input features ([out, in / tp]); the input is
// this rank's slice of the features. Forward multiplies locally and all-reduces the output (with
// sequence_parallel: reduce-scatters it along `sequence_dim`); the bias, replicated, is added
// once, after the reduction. Under sequence_parallel each rank adds the bias to its own tokens
// only, so the bias gradient is summed over the group (copy_to_region on the bias).
//
// Under autocast both compute in the autocast dtype, as at::linear would.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "tensor_parallel/regions.h"

namespace shardwise::tensor_parallel {

struct ParallelOptions {
  Group group;                     // the tensor-parallel group
  bool sequence_parallel = false;  // activations outside the layer are split along the sequence
  int64_t sequence_dim = 1;        // [batch, seq, hidden] by default
  bool save_gathered = false;      // column, sequence_parallel: keep the gathered input
};

at::Tensor column_parallel_linear(const at::Tensor& input,
                                  const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias,
                                  const ParallelOptions& options);

at::Tensor row_parallel_linear(const at::Tensor& input,
                               const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias,
                               const ParallelOptions& options);

}  // namespace shardwise::tensor_parallel
