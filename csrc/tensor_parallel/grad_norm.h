// Gradient-norm clipping for a tensor-parallel model: the L2 norm over the whole model, where
// the gradients of split parameters are squared and summed over the tensor-parallel group and
// those of replicated parameters (equal on every tp rank) count once. With `shard_group`, the
// gradients are FSDP shards and their squares are summed over it too; with `stage_group`, each
// rank holds its pipeline stages' parameters and the squares are summed over the stages. If the
// norm exceeds `max_norm` (> 0), every gradient is multiplied by max_norm / (norm + 1e-6) when
// that is below 1, as torch.nn.utils.clip_grad_norm_ does; `copies` (a tie's second copy, held
// beside the first) are scaled with them but not counted. Returns the norm before clipping.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "tensor_parallel/regions.h"

namespace shardwise::tensor_parallel {

struct ClipOptions {
  double max_norm = 0.0;  // 0: only measure
  Group tp_group;         // null: no tensor parallelism
  Group shard_group;      // null: whole (unsharded) gradients
  Group stage_group;      // pipeline stages (disjoint parameters): both sums over it; null: none
};

// The norm from this rank's sums of squares of split and replicated gradients: both summed over
// `shard_group` and `stage_group`, the split ones over `tp_group` (max_norm unused). Collective
// over both groups.
double global_norm(double split_squares, double replicated_squares, const ClipOptions& options);

double clip_grad_norm_(const std::vector<at::Tensor>& split_grads,
                       const std::vector<at::Tensor>& replicated_grads,
                       const ClipOptions& options,
                       const std::vector<at::Tensor>& copies = {});

}  // namespace shardwise::tensor_parallel
