// One gradient-norm clip over the whole mesh, as torch.nn.utils.clip_grad_norm_ computes it on
// the unsharded model: the L2 norm of every gradient of the full model, each element counted
// once, whatever the strategy holds where. This rank's gradients come in three kinds:
//
//   - split: tensor-parallel shards; their squares are summed over `tp_group`;
//   - replicated: equal on every tp rank; counted once (not summed over tp);
//   - copies: the second copy of a tie across pipeline stages (a GPT head's copy of the token
//     embedding, on the last stage); left out of the norm (the first stage counts the tie) but
//     scaled with the rest.
//
// Both kinds' squares are summed over `shard_group` (FSDP shards) and `stage_group` (pipeline
// stages hold disjoint parameters): tensor_parallel::global_norm. With max_norm > 0, when
// max_norm / (norm + 1e-6) is below 1 every gradient, copies included, is multiplied by it, by
// tensor_parallel::clip_grad_norm_. Returns the norm before clipping. Collective over the groups
// given.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tensor_parallel/grad_norm.h"
#include "tensor_parallel/sharded_parameters.h"

namespace shardwise::training {

struct MeshGradients {
  std::vector<at::Tensor> split;
  std::vector<at::Tensor> replicated;
  std::vector<at::Tensor> copies;
};

// The gradients of `named` parameters sorted into the three kinds: a name in `copies` is a tie's
// copy, one that `split` says is split a tp shard, the rest replicated; parameters without a
// gradient are left out.
MeshGradients mesh_gradients(const std::vector<std::pair<std::string, at::Tensor>>& named,
                             const std::function<bool(const std::string&)>& split,
                             const std::vector<std::string>& copies = {});

// The gradients of tensor-parallel `params`: shards split, the rest replicated.
MeshGradients mesh_gradients(const tensor_parallel::ShardedParameters& params);

double clip_grad_norm_over_mesh(const MeshGradients& grads,
                                const tensor_parallel::ClipOptions& options);

}  // namespace shardwise::training
