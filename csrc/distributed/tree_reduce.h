// The deterministic gradient reductions of a training run whose result must not depend on the
// world size: sums over a process group associated as the balanced binary tree over the rank
// index, ((x0 + x1) + (x2 + x3)) + .., for a power-of-two group, and the same tree over the
// leaves one rank adds up itself (collectives/pairwise_sum.h).
//
// On the shardwise backend the tree runs inside the collective (collectives/tree_reduce.cc:
// recursive halving, no extra memory beyond a segment). On any other backend (gloo, NCCL) the
// fallback moves the operands instead of partial sums: an all-to-all brings every rank's block
// `rank` here, the rows are added pairwise in rank order (at::add, the same IEEE additions), and
// an all-gather completes the all-reduce. Both give the same bits. 16-bit floats are added in
// float32 and rounded once, as the backend's collectives do.
#pragma once

#include <ATen/core/Tensor.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "collectives/pairwise_sum.h"

namespace shardwise::distributed {

// In place: `tensor` (floating point, on every rank the same shape) becomes the tree sum over
// `group`. Throws c10::ValueError naming the group size when it is not a power of two.
void tree_all_reduce_(c10d::ProcessGroup& group, at::Tensor& tensor);

// `output` (numel n) receives block `rank` of `input` (numel size * n, rank-major) summed over
// `group` by the tree. Returns the backend's Work to wait for before reading `output` (the
// shardwise backend runs it asynchronously), or null when it is complete already.
c10::intrusive_ptr<c10d::Work> tree_reduce_scatter(c10d::ProcessGroup& group,
                                                   at::Tensor& output,
                                                   const at::Tensor& input);

// The rows of `stacked` ([count, ...]) summed as the balanced binary tree over the row index
// (collectives/pairwise_sum.h's rule), in float32 for 16-bit floats; the fallback's local step.
at::Tensor pairwise_sum_rows(const at::Tensor& stacked);

// Leaves pushed one by one (each a list of tensors of fixed shapes, e.g. one micro-batch's
// gradients), summed as the balanced binary tree over the push index: with tree_all_reduce_ of
// each step's leaf over the ranks, the total does not depend on the world size.
// The leaves' tensors are taken: the older sum's are added into (older + newer, the same bits
// as a fresh add), so pass tensors nobody else reads.
class PairwiseGradients {
 public:
  using Leaf = std::vector<at::Tensor>;
  // Throws c10::ValueError when the leaf's shapes or dtypes differ from the first leaf's.
  void push(Leaf leaf);
  // The sum; then empty again. Throws std::logic_error when nothing was pushed.
  Leaf finish() { return sum_.finish(); }
  void clear() { sum_.clear(); }
  // The sum so far into `out` (tensors of the leaves' shapes), without consuming it: the newest
  // partial sum copied, then each older one added (finish's additions, in its order).
  void total_into(std::vector<at::Tensor>& out) const;
  size_t count() const { return sum_.count(); }
  size_t partial_sums() const { return sum_.partial_sums(); }

 private:
  static Leaf add(Leaf older, Leaf newer);
  collectives::PairwiseSum<Leaf, Leaf (*)(Leaf, Leaf)> sum_{&PairwiseGradients::add};
  Leaf first_;  // shapes and dtypes of the first leaf since the last finish (meta tensors)
};

}  // namespace shardwise::distributed
