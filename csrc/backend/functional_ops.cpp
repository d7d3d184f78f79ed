// Functional collectives: tensor in, new tensor out, the process group named by a string, as
// torch custom ops (schemas in csrc/registration.cpp, fake kernels in
// python/shardwise/ops/collectives.py), so they compose with torch.compile. They run through the
// named group's own backend (shardwise, gloo or NCCL) and return once the result is ready.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // _allgather_base: in 2.13 and 2.14
#endif

namespace shardwise::backend {
namespace {

c10d::ReduceOp parse_reduce_op(const std::string& name, const char* op) {
  if (name == "sum") return c10d::ReduceOp::SUM;
  if (name == "avg") return c10d::ReduceOp::AVG;
  if (name == "product") return c10d::ReduceOp::PRODUCT;
  if (name == "min") return c10d::ReduceOp::MIN;
  if (name == "max") return c10d::ReduceOp::MAX;
  TORCH_CHECK_VALUE(false, "shardwise.", op, ": argument 'reduce_op' is '", name,
                    "'; valid: sum, avg, product, min, max");
}

c10::intrusive_ptr<c10d::ProcessGroup> group_of(const std::string& group_name,
                                                int64_t group_size,
                                                const char* op) {
  auto group = c10d::resolve_process_group(group_name);
  TORCH_CHECK_VALUE(group_size < 0 || group_size == group->getSize(), "shardwise.", op,
                    ": argument 'group_size' is ", group_size, " but group '", group_name, "' has ",
                    group->getSize(), " ranks");
  return group;
}

at::Tensor all_reduce(const at::Tensor& input, std::string reduce_op, std::string group_name) {
  c10d::AllreduceOptions options;
  options.reduceOp = parse_reduce_op(reduce_op, "all_reduce");
  std::vector<at::Tensor> tensors{input.clone(at::MemoryFormat::Contiguous)};
  group_of(group_name, -1, "all_reduce")->allreduce(tensors, options)->wait();
  return tensors[0];
}

at::Tensor all_gather_into_tensor(const at::Tensor& input,
                                  int64_t group_size,
                                  std::string group_name) {
  auto group = group_of(group_name, group_size, "all_gather_into_tensor");
  at::Tensor in = input.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  if (shape.empty()) shape.push_back(1);
  shape[0] *= group_size;
  at::Tensor output = at::empty(shape, in.options());
  group->_allgather_base(output, in)->wait();
  return output;
}

at::Tensor reduce_scatter_tensor(const at::Tensor& input,
                                 std::string reduce_op,
                                 int64_t group_size,
                                 std::string group_name) {
  auto group = group_of(group_name, group_size, "reduce_scatter_tensor");
  TORCH_CHECK_VALUE(input.dim() > 0 && input.size(0) % group_size == 0,
                    "shardwise.reduce_scatter_tensor: dim 0 of 'input' (",
                    input.dim() ? input.size(0) : 0, ") must divide by 'group_size' (", group_size,
                    ")");
  at::Tensor in = input.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] /= group_size;
  at::Tensor output = at::empty(shape, in.options());
  c10d::ReduceScatterOptions options;
  options.reduceOp = parse_reduce_op(reduce_op, "reduce_scatter_tensor");
  group->_reduce_scatter_base(output, in, options)->wait();
  return output;
}

}  // namespace

TORCH_LIBRARY_IMPL(shardwise, CompositeExplicitAutograd, m) {
  m.impl("all_reduce", &all_reduce);
  m.impl("all_gather_into_tensor", &all_gather_into_tensor);
  m.impl("reduce_scatter_tensor", &reduce_scatter_tensor);
}

}  // namespace shardwise::backend
