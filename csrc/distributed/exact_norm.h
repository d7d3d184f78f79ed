// The L2 norm of a tensor list split over a process group (each rank holds its own pieces, e.g.
// FSDP's gradient shards), summed exactly (distributed/exact_square_sum.h): the same bits on
// every rank however the pieces are split, so a clip by it does not depend on the world size.
#pragma once

#include <ATen/core/Tensor.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

namespace shardwise::distributed {

// Floating-point pieces, widened to float32 (float64 pieces are refused: their squares are not
// exact in the bins). `group` null or of one rank: this rank's pieces only.
double exact_norm(const std::vector<at::Tensor>& pieces, c10d::ProcessGroup* group);

// Clips `grads` in place by their exact norm over `group` (scaled by max_norm / (norm + 1e-6)
// when that is below 1, as torch's clip_grad_norm_); returns the norm.
double clip_grad_norm_exact_(const std::vector<at::Tensor>& grads,
                             double max_norm,
                             c10d::ProcessGroup* group);

}  // namespace shardwise::distributed
