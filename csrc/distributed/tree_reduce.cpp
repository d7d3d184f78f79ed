// The deterministic reductions over a process group: the shardwise backend's own tree, or the
// fallback over any backend (see tree_reduce.h).
#include "distributed/tree_reduce.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>
#include <utility>

#include "backend/shardwise_backend.hpp"

namespace shardwise::distributed {
namespace {

void check_group(c10d::ProcessGroup& group, const at::Tensor& tensor, const char* op) {
  const int size = group.getSize();
  TORCH_CHECK_VALUE(size > 0 && (size & (size - 1)) == 0, op, ": the deterministic tree needs a ",
                    "power-of-two group size, got ", size, "; use 1, 2, 4, 8, .. ranks");
  TORCH_CHECK_VALUE(at::isFloatingType(tensor.scalar_type()), op,
                    ": the deterministic tree sums floating-point tensors, got ",
                    tensor.scalar_type());
}

// The shardwise backend serving `tensor`'s device in `group`, or null.
backend::ShardwiseBackend* shardwise_backend(c10d::ProcessGroup& group, const at::Tensor& tensor) {
  if (!tensor.is_cpu() || !group.hasBackends()) return nullptr;
  try {
    return dynamic_cast<backend::ShardwiseBackend*>(group.getBackend(c10::DeviceType::CPU).get());
  } catch (const c10::Error&) {
    return nullptr;  // no CPU backend registered in this group
  }
}

at::Tensor widened(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat)
                                                                          : t.contiguous();
}

// Block `rank` of every rank's `flat` (size * n elements), summed by the tree: [n].
at::Tensor fallback_reduce_scatter(c10d::ProcessGroup& group, const at::Tensor& flat) {
  at::Tensor wide = widened(flat);
  at::Tensor rows = at::empty_like(wide);
  std::vector<int64_t> even;  // equal splits
  group.alltoall_base(rows, wide, even, even)->wait();
  return pairwise_sum_rows(rows.view({group.getSize(), -1}));
}

}  // namespace

at::Tensor pairwise_sum_rows(const at::Tensor& stacked) {
  TORCH_CHECK_VALUE(stacked.dim() >= 1 && stacked.size(0) > 0,
                    "pairwise_sum_rows: needs at least one row");
  // One level of the tree at a time: rows (2i, 2i + 1) added; an odd last row waits for the
  // fold (as PairwiseSum leaves it). Collected as PairwiseSum pushes them, so the rule is one.
  collectives::PairwiseSum<at::Tensor, at::Tensor (*)(at::Tensor, at::Tensor)> sum(
      [](at::Tensor older, at::Tensor newer) { return older.add_(newer); });
  at::Tensor wide = widened(stacked);
  for (int64_t r = 0; r < wide.size(0); ++r) sum.push(wide[r].clone());
  return sum.finish();
}

void tree_all_reduce_(c10d::ProcessGroup& group, at::Tensor& tensor) {
  check_group(group, tensor, "tree_all_reduce");
  if (group.getSize() == 1 || tensor.numel() == 0) return;
  if (auto* native = shardwise_backend(group, tensor)) {
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    native->tree_allreduce(tensor, options)->wait();
    return;
  }
  const int64_t size = group.getSize();
  const int64_t n = tensor.numel();
  const int64_t share = (n + size - 1) / size;
  at::Tensor padded = at::zeros({share * size}, tensor.options());
  padded.narrow(0, 0, n).copy_(tensor.reshape({-1}));
  at::Tensor mine = fallback_reduce_scatter(group, padded);
  at::Tensor all = at::empty({share * size}, mine.options());
  group._allgather_base(all, mine)->wait();
  tensor.copy_(all.narrow(0, 0, n).view(tensor.sizes()));
}

c10::intrusive_ptr<c10d::Work> tree_reduce_scatter(c10d::ProcessGroup& group,
                                                   at::Tensor& output,
                                                   const at::Tensor& input) {
  check_group(group, input, "tree_reduce_scatter");
  TORCH_CHECK_VALUE(input.numel() == output.numel() * group.getSize() &&
                        input.scalar_type() == output.scalar_type(),
                    "tree_reduce_scatter: input has ", input.numel(), " elements of ",
                    input.scalar_type(), "; expected the group size (", group.getSize(),
                    ") x output numel (", output.numel(), ") of ", output.scalar_type());
  if (auto* native = shardwise_backend(group, input)) {
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    at::Tensor in = input;
    return native->tree_reduce_scatter(output, in, options);
  }
  if (group.getSize() == 1) {
    output.copy_(input.view(output.sizes()));
    return {};
  }
  output.copy_(fallback_reduce_scatter(group, input.reshape({-1})).view(output.sizes()));
  return {};
}

void PairwiseGradients::push(Leaf leaf) {
  if (sum_.count() == 0) {
    first_.clear();
    for (const auto& t : leaf)
      first_.push_back(at::empty(t.sizes(), t.options().device(at::kMeta)));
  }
  TORCH_CHECK_VALUE(leaf.size() == first_.size(), "PairwiseGradients.push: ", leaf.size(),
                    " tensors; the first leaf had ", first_.size());
  for (size_t i = 0; i < leaf.size(); ++i) {
    TORCH_CHECK_VALUE(
        leaf[i].sizes() == first_[i].sizes() && leaf[i].scalar_type() == first_[i].scalar_type(),
        "PairwiseGradients.push: tensor ", i, " has shape ", leaf[i].sizes(), " and ",
        leaf[i].scalar_type(), "; the first leaf's had ", first_[i].sizes(), " and ",
        first_[i].scalar_type());
  }
  sum_.push(std::move(leaf));
}

void PairwiseGradients::total_into(std::vector<at::Tensor>& out) const {
  sum_.visit_newest_first([&](const Leaf& partial, bool newest) {
    TORCH_CHECK_VALUE(partial.size() == out.size(), "PairwiseGradients.total_into: ", out.size(),
                      " outputs for leaves of ", partial.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (newest) {
        out[i].copy_(partial[i]);
      } else {
        out[i].add_(partial[i]);  // partial + total: addition commutes bit for bit
      }
    }
  });
}

PairwiseGradients::Leaf PairwiseGradients::add(Leaf older, Leaf newer) {
  for (size_t i = 0; i < older.size(); ++i) older[i].add_(newer[i]);
  return older;
}

}  // namespace shardwise::distributed
