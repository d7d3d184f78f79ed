#include "tensor_parallel/regions.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // _allgather_base: in 2.13 and 2.14
#endif

namespace shardwise::tensor_parallel {
namespace {
using torch::autograd::AutogradContext;
}  // namespace

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t wrap_dim(int64_t dim, const at::Tensor& t, const char* op) {
  const int64_t n = t.dim();
  TORCH_CHECK_VALUE(n > 0 && dim >= -n && dim < n, "tensor_parallel.", op, ": dim ", dim,
                    " is out of range for a tensor of shape ", t.sizes());
  return dim < 0 ? dim + n : dim;
}

// [..., tp * s_dim, ...] -> a contiguous [tp * ..., ...] whose leading blocks are the ranks'
// slices of `dim` (what reduce-scatter expects), and the inverse for all-gather's output.
at::Tensor rank_major(const at::Tensor& full, int64_t dim, int64_t tp) {
  if (dim == 0) return full.contiguous();
  auto shape = full.sizes().vec();
  shape[dim] /= tp;
  shape.insert(shape.begin() + dim, tp);
  return full.reshape(shape).movedim(dim, 0).contiguous();
}

at::Tensor from_rank_major(const at::Tensor& gathered,
                           const at::IntArrayRef local,
                           int64_t dim,
                           int64_t tp) {
  auto shape = local.vec();
  shape.insert(shape.begin(), tp);
  at::Tensor t = gathered.view(shape).movedim(0, dim);
  auto merged = local.vec();
  merged[dim] *= tp;
  return t.reshape(merged);
}

struct CopyToRegion : public torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, Group group) {
    save_group(ctx, group);
    return input.view_as(input);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduce_sum(grads[0], load_group(ctx)), at::Tensor()};
  }
};

struct ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& input, Group group) {
    return all_reduce_sum(input, group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

at::Tensor slice_dim(const at::Tensor& input, int64_t dim, const Group& group) {
  const int64_t tp = group->getSize();
  TORCH_CHECK_VALUE(input.size(dim) % tp == 0, "tensor_parallel.scatter_along: size ",
                    input.size(dim), " of dim ", dim, " is not divisible by the group's ", tp,
                    " ranks");
  return input.chunk(tp, dim)[group->getRank()].contiguous();
}

// A region along a dimension: `forward_op` forward, `backward_op` on the gradient backward.
using DimOp = at::Tensor (*)(const at::Tensor&, int64_t, const Group&);
template <DimOp forward_op, DimOp backward_op>
struct DimRegion : public torch::autograd::Function<DimRegion<forward_op, backward_op>> {
  static at::Tensor forward(AutogradContext* ctx,
                            const at::Tensor& input,
                            int64_t dim,
                            Group group) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return forward_op(input, dim, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {backward_op(grads[0], ctx->saved_data["dim"].toInt(), load_group(ctx)), at::Tensor(),
            at::Tensor()};
  }
};
using GatherAlong = DimRegion<all_gather_dim, reduce_scatter_dim>;
using ReduceScatterAlong = DimRegion<reduce_scatter_dim, all_gather_dim>;
using ScatterAlong = DimRegion<slice_dim, all_gather_dim>;

void check_group(const Group& group, const char* op) {
  TORCH_CHECK_VALUE(group, "tensor_parallel.", op,
                    ": argument 'group' is null; pass the "
                    "tensor-parallel process group");
}

}  // namespace

void save_group(AutogradContext* ctx, const Group& group) {
  ctx->saved_data["group"] = at::IValue::make_capsule(
      c10::intrusive_ptr<torch::CustomClassHolder>::reclaim_copy(group.get()));
}

Group load_group(AutogradContext* ctx) {
  auto holder = ctx->saved_data["group"].toCapsule();
  return c10::intrusive_ptr<c10d::ProcessGroup>::reclaim_copy(
      static_cast<c10d::ProcessGroup*>(holder.get()));
}

at::Tensor Pending::wait() {
  if (work) work->wait();
  work.reset();
  if (finish) result = std::exchange(finish, nullptr)(result);
  return result;
}

Pending all_reduce_sum_async(at::Tensor buffer, const Group& group) {
  check_group(group, "all_reduce");
  if (group->getSize() == 1) return {nullptr, buffer, nullptr};
  std::vector<at::Tensor> tensors{buffer};
  auto work = group->allreduce(tensors);
  return {work, buffer, nullptr};
}

at::Tensor all_reduce_sum(const at::Tensor& input, const Group& group) {
  return all_reduce_sum_async(input.clone(at::MemoryFormat::Contiguous), group).wait();
}

at::Tensor all_reduce_max(const at::Tensor& input, const Group& group) {
  check_group(group, "all_reduce");
  at::Tensor buffer = input.clone(at::MemoryFormat::Contiguous);
  if (group->getSize() == 1) return buffer;
  std::vector<at::Tensor> tensors{buffer};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  group->allreduce(tensors, options)->wait();
  return buffer;
}

Pending all_gather_dim_async(const at::Tensor& input, int64_t dim, const Group& group) {
  check_group(group, "all_gather");
  dim = wrap_dim(dim, input, "all_gather");
  const int64_t tp = group->getSize();
  if (tp == 1) return {nullptr, input, nullptr};
  at::Tensor in = input.contiguous();
  auto shape = in.sizes().vec();
  shape[0] *= tp;
  at::Tensor gathered = at::empty(shape, in.options());
  auto work = group->_allgather_base(gathered, in);
  // Some backends (gloo) fill `gathered` only when waited on: lay it out after the wait.
  const std::vector<int64_t> local = in.sizes().vec();
  return {work, gathered,
          [local, dim, tp](const at::Tensor& out) { return from_rank_major(out, local, dim, tp); }};
}

at::Tensor all_gather_dim(const at::Tensor& input, int64_t dim, const Group& group) {
  return all_gather_dim_async(input, dim, group).wait();
}

Pending reduce_scatter_dim_async(const at::Tensor& input, int64_t dim, const Group& group) {
  check_group(group, "reduce_scatter");
  dim = wrap_dim(dim, input, "reduce_scatter");
  const int64_t tp = group->getSize();
  TORCH_CHECK_VALUE(input.size(dim) % tp == 0, "tensor_parallel.reduce_scatter: size ",
                    input.size(dim), " of dim ", dim, " is not divisible by the group's ", tp,
                    " ranks; make the sequence length a multiple of the tp size");
  if (tp == 1) return {nullptr, input.contiguous(), nullptr};
  auto shape = input.sizes().vec();
  shape[dim] /= tp;
  auto flat = shape;  // [tp * shape[0], ...]: the leading-dimension layout backends expect
  flat[0] *= tp;
  at::Tensor in = rank_major(input, dim, tp).view(flat);
  at::Tensor out = at::empty(shape, in.options());
  auto work = group->_reduce_scatter_base(out, in);
  return {work, out, nullptr};
}

at::Tensor reduce_scatter_dim(const at::Tensor& input, int64_t dim, const Group& group) {
  return reduce_scatter_dim_async(input, dim, group).wait();
}

at::Tensor copy_to_region(const at::Tensor& input, const Group& group) {
  check_group(group, "copy_to_region");
  return CopyToRegion::apply(input, group);
}

at::Tensor reduce_from_region(const at::Tensor& input, const Group& group) {
  check_group(group, "reduce_from_region");
  return ReduceFromRegion::apply(input, group);
}

at::Tensor gather_along(const at::Tensor& input, int64_t dim, const Group& group) {
  check_group(group, "gather_along");
  return GatherAlong::apply(input, wrap_dim(dim, input, "gather_along"), group);
}

at::Tensor reduce_scatter_along(const at::Tensor& input, int64_t dim, const Group& group) {
  check_group(group, "reduce_scatter_along");
  return ReduceScatterAlong::apply(input, wrap_dim(dim, input, "reduce_scatter_along"), group);
}

at::Tensor scatter_along(const at::Tensor& input, int64_t dim, const Group& group) {
  check_group(group, "scatter_along");
  return ScatterAlong::apply(input, wrap_dim(dim, input, "scatter_along"), group);
}

}  // namespace shardwise::tensor_parallel
