// The sharding ops: argument checks and plans shared by every device (shard_ops_impl.h), the CPU
// implementations (copy runs split into pieces for at::parallel_for), and the C++ API of
// shard_ops.h, which calls through the dispatcher.
#include "sharding/shard_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

#include "sharding/flat_layout.h"
#include "sharding/shard_ops_impl.h"
#include "sharding/shard_plans.h"

namespace shardwise::sharding {
namespace {

constexpr int64_t kGrain = int64_t{1} << 16;  // elements per parallel piece

Element element_of(const char* op, const char* what, at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return Element::kFloat32;
    case at::kDouble:
      return Element::kFloat64;
    case at::kBFloat16:
      return Element::kBFloat16;
    case at::kHalf:
      return Element::kFloat16;
    default:
      TORCH_CHECK_TYPE(false, op, ": ", what, " has dtype ", dtype,
                       "; sharded parameters and gradients must be float32, float64, bfloat16 or "
                       "float16");
  }
}

FlatLayout make_layout(const char* op, at::IntArrayRef numels, int64_t world_size) {
  TORCH_CHECK_VALUE(world_size >= 1, op, ": world_size must be >= 1, got ", world_size);
  for (size_t i = 0; i < numels.size(); ++i) {
    TORCH_CHECK_VALUE(numels[i] >= 0, op, ": numels[", i, "] = ", numels[i], " is negative");
  }
  return FlatLayout({numels.vec(), static_cast<int>(world_size), kShardAlign});
}

void check_rank(const char* op, int64_t rank, int64_t world_size) {
  TORCH_CHECK_VALUE(rank >= 0 && rank < world_size, op, ": rank ", rank, " is outside [0, ",
                    world_size, ")");
}

void check_count(const char* op, const char* what, size_t given, size_t expected) {
  TORCH_CHECK_VALUE(given == expected, op, ": ", given, " ", what, " for ", expected,
                    " entries of numels; pass one per parameter");
}

void check_same(const char* op,
                const std::string& what,
                const at::Tensor& tensor,
                const at::Tensor& first,
                int64_t numel) {
  TORCH_CHECK_VALUE(tensor.numel() == numel, op, ": ", what, " has ", tensor.numel(),
                    " elements, expected ", numel, " (see the layout in sharding/flat_layout.h)");
  TORCH_CHECK_TYPE(tensor.scalar_type() == first.scalar_type(), op, ": ", what, " has dtype ",
                   tensor.scalar_type(), " but the first has ", first.scalar_type(),
                   "; cast them to one dtype");
  TORCH_CHECK_VALUE(tensor.device() == first.device(), op, ": ", what, " is on ", tensor.device(),
                    " but the first is on ", first.device());
}

// A contiguous tensor's data pointer (non-contiguous inputs are copied first and kept alive).
const void* data_of(const at::Tensor& tensor, std::vector<at::Tensor>& keep) {
  if (tensor.is_contiguous()) return tensor.const_data_ptr();
  keep.push_back(tensor.contiguous());
  return keep.back().const_data_ptr();
}

void execute_cpu(const std::vector<CopyRun>& runs,
                 const CopyRunsOptions& options,
                 const at::Tensor&) {
  const size_t src_bytes = element_bytes(options.src);
  const size_t dst_bytes = element_bytes(options.dst);
  std::vector<CopyRun> pieces;
  pieces.reserve(runs.size());
  for (const CopyRun& run : runs) {  // cut long runs so both cores share one large parameter
    for (int64_t first = 0; first < run.count; first += kGrain) {
      const void* src =
          run.src == nullptr ? nullptr : static_cast<const char*>(run.src) + first * src_bytes;
      pieces.push_back({src, static_cast<char*>(run.dst) + first * dst_bytes,
                        std::min(kGrain, run.count - first)});
    }
  }
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    copy_runs_cpu(pieces.data() + begin, end - begin, options);
  });
}

}  // namespace

at::Tensor all_gather_copy_in_impl(at::TensorList shards,
                                   at::IntArrayRef numels,
                                   int64_t world_size,
                                   int64_t rank,
                                   at::ScalarType dtype,
                                   const Executor& execute) {
  const char* op = "shardwise.all_gather_copy_in";
  const FlatLayout layout = make_layout(op, numels, world_size);
  check_rank(op, rank, world_size);
  check_count(op, "shards", shards.size(), numels.size());
  TORCH_CHECK_VALUE(!shards.empty(), op, ": needs at least one shard");
  std::vector<at::Tensor> keep;
  std::vector<const void*> sources;
  for (size_t i = 0; i < shards.size(); ++i) {
    check_same(op, "shards[" + std::to_string(i) + "]", shards[i], shards[0],
               layout.valid(static_cast<int64_t>(i), static_cast<int>(rank)));
    sources.push_back(data_of(shards[i], keep));
  }
  at::Tensor shard = at::empty({layout.shard_numel()}, shards[0].options().dtype(dtype));
  CopyRunsOptions options{element_of(op, "shards", shards[0].scalar_type()),
                          element_of(op, "dtype", dtype)};
  const auto runs =
      plan_all_gather_copy_in(layout, static_cast<int>(rank), sources, shard.mutable_data_ptr(),
                              {element_bytes(options.src), element_bytes(options.dst)});
  execute(runs, options, shard);
  return shard;
}

void all_gather_copy_out_into_impl(const at::Tensor& gathered,
                                   at::IntArrayRef numels,
                                   int64_t world_size,
                                   at::TensorList params,
                                   const Executor& execute) {
  const char* op = "shardwise.all_gather_copy_out";
  const FlatLayout layout = make_layout(op, numels, world_size);
  check_same(op, "gathered", gathered, gathered, layout.total_numel());
  check_count(op, "params", params.size(), numels.size());
  const Element element = element_of(op, "gathered", gathered.scalar_type());
  std::vector<at::Tensor> keep;
  const void* source = data_of(gathered, keep);
  std::vector<void*> outputs;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string what = "params[" + std::to_string(i) + "]";
    check_same(op, what, params[i], gathered, numels[i]);
    TORCH_CHECK_VALUE(params[i].is_contiguous(), op, ": ", what, " must be contiguous");
    outputs.push_back(params[i].mutable_data_ptr());
  }
  const size_t bytes = element_bytes(element);
  execute(plan_all_gather_copy_out(layout, source, outputs, {bytes, bytes}), {element, element},
          gathered);
}

std::vector<at::Tensor> all_gather_copy_out_impl(const at::Tensor& gathered,
                                                 at::IntArrayRef numels,
                                                 int64_t world_size,
                                                 const Executor& execute) {
  std::vector<at::Tensor> params;
  for (int64_t n : numels) {
    TORCH_CHECK_VALUE(n >= 0, "shardwise.all_gather_copy_out: numels has a negative entry ", n);
    params.push_back(at::empty({n}, gathered.options()));
  }
  all_gather_copy_out_into_impl(gathered, numels, world_size, params, execute);
  return params;
}

namespace {

// The gradients' data pointers (nullptr for a missing gradient: its pieces are zero-filled),
// checked against the layout; returns the first gradient, which sets dtype and device.
at::Tensor gradient_sources(const char* op,
                            const c10::List<std::optional<at::Tensor>>& grads,
                            const FlatLayout& layout,
                            std::vector<const void*>& sources,
                            std::vector<at::Tensor>& keep) {
  check_count(op, "grads", grads.size(), static_cast<size_t>(layout.num_params()));
  at::Tensor first;
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::optional<at::Tensor> grad = grads.get(i);
    if (!grad.has_value() || !grad->defined()) {
      sources.push_back(nullptr);
      continue;
    }
    if (!first.defined()) first = *grad;
    check_same(op, "grads[" + std::to_string(i) + "]", *grad, first,
               layout.numel(static_cast<int64_t>(i)));
    sources.push_back(data_of(*grad, keep));
  }
  TORCH_CHECK_VALUE(first.defined(), op, ": every gradient is None; pass at least one tensor");
  return first;
}

void copy_gradients_in(const char* op,
                       const at::Tensor& first,
                       const FlatLayout& layout,
                       const std::vector<const void*>& sources,
                       double scale,
                       const at::Tensor& buffer,
                       const Executor& execute) {
  CopyRunsOptions options{element_of(op, "grads", first.scalar_type()),
                          element_of(op, "buffer", buffer.scalar_type()), scale};
  execute(plan_reduce_scatter_copy_in(layout, sources, buffer.mutable_data_ptr(),
                                      {element_bytes(options.src), element_bytes(options.dst)}),
          options, buffer);
}

}  // namespace

at::Tensor reduce_scatter_copy_in_impl(const c10::List<std::optional<at::Tensor>>& grads,
                                       at::IntArrayRef numels,
                                       int64_t world_size,
                                       at::ScalarType dtype,
                                       double scale,
                                       const Executor& execute) {
  const char* op = "shardwise.reduce_scatter_copy_in";
  const FlatLayout layout = make_layout(op, numels, world_size);
  std::vector<const void*> sources;
  std::vector<at::Tensor> keep;
  const at::Tensor first = gradient_sources(op, grads, layout, sources, keep);
  element_of(op, "dtype", dtype);
  at::Tensor buffer = at::empty({layout.total_numel()}, first.options().dtype(dtype));
  copy_gradients_in(op, first, layout, sources, scale, buffer, execute);
  return buffer;
}

void reduce_scatter_copy_in_into_impl(const c10::List<std::optional<at::Tensor>>& grads,
                                      at::IntArrayRef numels,
                                      int64_t world_size,
                                      double scale,
                                      const at::Tensor& buffer,
                                      const Executor& execute) {
  const char* op = "shardwise.reduce_scatter_copy_in_";
  const FlatLayout layout = make_layout(op, numels, world_size);
  std::vector<const void*> sources;
  std::vector<at::Tensor> keep;
  const at::Tensor first = gradient_sources(op, grads, layout, sources, keep);
  TORCH_CHECK_VALUE(buffer.numel() == layout.total_numel(), op, ": buffer has ", buffer.numel(),
                    " elements, expected ", layout.total_numel(),
                    " (world_size * shard_numel; see sharding/flat_layout.h)");
  TORCH_CHECK_VALUE(buffer.is_contiguous(), op, ": buffer must be contiguous");
  TORCH_CHECK_VALUE(buffer.device() == first.device(), op, ": buffer is on ", buffer.device(),
                    " but the gradients are on ", first.device());
  copy_gradients_in(op, first, layout, sources, scale, buffer, execute);
}

void reduce_scatter_copy_out_acc_impl(const at::Tensor& reduced,
                                      at::IntArrayRef numels,
                                      int64_t world_size,
                                      int64_t rank,
                                      double scale,
                                      at::TensorList shard_grads,
                                      bool accumulate,
                                      const Executor& execute) {
  const char* op = "shardwise.reduce_scatter_copy_out";
  const FlatLayout layout = make_layout(op, numels, world_size);
  check_rank(op, rank, world_size);
  check_count(op, "shard_grads", shard_grads.size(), numels.size());
  check_same(op, "reduced", reduced, reduced, layout.shard_numel());
  std::vector<at::Tensor> keep;
  const void* source = data_of(reduced, keep);
  std::vector<void*> outputs;
  for (size_t i = 0; i < shard_grads.size(); ++i) {
    const std::string what = "shard_grads[" + std::to_string(i) + "]";
    check_same(op, what, shard_grads[i], shard_grads[0],
               layout.valid(static_cast<int64_t>(i), static_cast<int>(rank)));
    TORCH_CHECK_VALUE(shard_grads[i].is_contiguous(), op, ": ", what, " must be contiguous");
    TORCH_CHECK_VALUE(shard_grads[i].device() == reduced.device(), op, ": ", what, " is on ",
                      shard_grads[i].device(), " but reduced is on ", reduced.device());
    outputs.push_back(shard_grads[i].mutable_data_ptr());
  }
  if (shard_grads.empty()) return;
  CopyRunsOptions options{element_of(op, "reduced", reduced.scalar_type()),
                          element_of(op, "shard_grads", shard_grads[0].scalar_type()), scale,
                          accumulate};
  execute(plan_reduce_scatter_copy_out(layout, static_cast<int>(rank), source, outputs,
                                       {element_bytes(options.src), element_bytes(options.dst)}),
          options, reduced);
}

std::vector<at::Tensor> reduce_scatter_copy_out_impl(const at::Tensor& reduced,
                                                     at::IntArrayRef numels,
                                                     int64_t world_size,
                                                     int64_t rank,
                                                     at::ScalarType dtype,
                                                     double scale,
                                                     const Executor& execute) {
  const char* op = "shardwise.reduce_scatter_copy_out";
  const FlatLayout layout = make_layout(op, numels, world_size);
  check_rank(op, rank, world_size);
  element_of(op, "dtype", dtype);
  std::vector<at::Tensor> grads;
  for (int64_t i = 0; i < layout.num_params(); ++i) {
    grads.push_back(
        at::empty({layout.valid(i, static_cast<int>(rank))}, reduced.options().dtype(dtype)));
  }
  reduce_scatter_copy_out_acc_impl(reduced, numels, world_size, rank, scale, grads,
                                   /*accumulate=*/false, execute);
  return grads;
}

namespace {

TORCH_LIBRARY_IMPL(shardwise, CPU, m) { register_sharding_impls<execute_cpu>(m); }

}  // namespace
}  // namespace shardwise::sharding

namespace shardwise {

at::Tensor all_gather_copy_in(at::TensorList shards,
                              at::IntArrayRef numels,
                              int64_t world_size,
                              int64_t rank,
                              at::ScalarType dtype) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("shardwise::all_gather_copy_in", "")
          .typed<at::Tensor(at::TensorList, at::IntArrayRef, int64_t, int64_t, at::ScalarType)>();
  return op.call(shards, numels, world_size, rank, dtype);
}

std::vector<at::Tensor> all_gather_copy_out(const at::Tensor& gathered,
                                            at::IntArrayRef numels,
                                            int64_t world_size) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("shardwise::all_gather_copy_out", "")
          .typed<std::vector<at::Tensor>(const at::Tensor&, at::IntArrayRef, int64_t)>();
  return op.call(gathered, numels, world_size);
}

void all_gather_copy_out_(const at::Tensor& gathered,
                          at::IntArrayRef numels,
                          int64_t world_size,
                          at::TensorList params) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::all_gather_copy_out_", "")
                       .typed<void(const at::Tensor&, at::IntArrayRef, int64_t, at::TensorList)>();
  op.call(gathered, numels, world_size, params);
}

at::Tensor reduce_scatter_copy_in(const std::vector<std::optional<at::Tensor>>& grads,
                                  at::IntArrayRef numels,
                                  int64_t world_size,
                                  at::ScalarType dtype,
                                  double scale) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::reduce_scatter_copy_in", "")
                       .typed<at::Tensor(const c10::List<std::optional<at::Tensor>>&,
                                         at::IntArrayRef, int64_t, at::ScalarType, double)>();
  c10::List<std::optional<at::Tensor>> list;
  bool any = false;
  for (const auto& grad : grads) {
    list.push_back(grad);
    any = any || (grad.has_value() && grad->defined());
  }
  TORCH_CHECK_VALUE(any, "shardwise.reduce_scatter_copy_in: every gradient is None; pass at least ",
                    "one tensor");
  return op.call(list, numels, world_size, dtype, scale);
}

void reduce_scatter_copy_in_(const std::vector<std::optional<at::Tensor>>& grads,
                             at::IntArrayRef numels,
                             int64_t world_size,
                             double scale,
                             const at::Tensor& buffer) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::reduce_scatter_copy_in_", "")
                       .typed<void(const c10::List<std::optional<at::Tensor>>&, at::IntArrayRef,
                                   int64_t, double, const at::Tensor&)>();
  c10::List<std::optional<at::Tensor>> list;
  for (const auto& grad : grads) list.push_back(grad);
  op.call(list, numels, world_size, scale, buffer);
}

std::vector<at::Tensor> reduce_scatter_copy_out(const at::Tensor& reduced,
                                                at::IntArrayRef numels,
                                                int64_t world_size,
                                                int64_t rank,
                                                at::ScalarType dtype,
                                                double scale) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::reduce_scatter_copy_out", "")
                       .typed<std::vector<at::Tensor>(const at::Tensor&, at::IntArrayRef, int64_t,
                                                      int64_t, at::ScalarType, double)>();
  return op.call(reduced, numels, world_size, rank, dtype, scale);
}

void reduce_scatter_copy_out_(const at::Tensor& reduced,
                              at::IntArrayRef numels,
                              int64_t world_size,
                              int64_t rank,
                              double scale,
                              at::TensorList shard_grads,
                              bool accumulate) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::reduce_scatter_copy_out_", "")
                       .typed<void(const at::Tensor&, at::IntArrayRef, int64_t, int64_t, double,
                                   at::TensorList, bool)>();
  op.call(reduced, numels, world_size, rank, scale, shard_grads, accumulate);
}

}  // namespace shardwise
