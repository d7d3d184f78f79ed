// CPU implementations of the casting ops (ATen glue around cast_kernels.h) and the C++ API of
// cast_ops.h. The glue checks arguments, makes inputs contiguous, splits the work into chunks
// for at::parallel_for (each chunk runs the instruction set chosen at run time) and ORs the
// chunks' non-finite flags.
#include "precision/cast_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <atomic>

#include "precision/cast_checks.h"

namespace shardwise {
namespace precision {
namespace {

constexpr int64_t kGrain = int64_t{1} << 16;  // elements per parallel chunk

at::Tensor empty_output(const at::Tensor& input, at::ScalarType dtype) {
  return at::empty(input.sizes(), input.options().dtype(dtype));
}

// Casts contiguous `input` into contiguous `output`; returns the non-finite flag if requested.
bool cast_contiguous(const at::Tensor& input, at::Tensor& output, const CastOptions& options) {
  const CpuIsa isa = active_cpu_isa();
  const char* src = static_cast<const char*>(input.const_data_ptr());
  char* dst = static_cast<char*>(output.mutable_data_ptr());
  const int64_t in_size = input.element_size();
  const int64_t out_size = output.element_size();
  std::atomic<bool> nonfinite{false};
  at::parallel_for(0, input.numel(), kGrain, [&](int64_t begin, int64_t end) {
    if (cast_cpu(src + begin * in_size, dst + begin * out_size, end - begin, options, isa)) {
      nonfinite.store(true, std::memory_order_relaxed);
    }
  });
  return nonfinite.load();
}

at::Tensor cast_cpu_op(const at::Tensor& input, at::ScalarType dtype) {
  const CastOptions options = check_cast("shardwise.cast", input, dtype);
  at::Tensor output = empty_output(input, dtype);
  cast_contiguous(input.contiguous(), output, options);
  return output;
}

std::tuple<at::Tensor, at::Tensor> cast_check_finite_cpu_op(const at::Tensor& input,
                                                            at::ScalarType dtype) {
  CastOptions options = check_cast("shardwise.cast_check_finite", input, dtype);
  options.check_nonfinite = true;
  at::Tensor output = empty_output(input, dtype);
  const bool nonfinite = cast_contiguous(input.contiguous(), output, options);
  return {output, at::scalar_tensor(nonfinite, input.options().dtype(at::kBool))};
}

at::Tensor cast_stochastic_bf16_cpu_op(const at::Tensor& input, int64_t seed, int64_t offset) {
  check_stochastic(input, offset);
  const at::Tensor in = input.contiguous();
  at::Tensor output = empty_output(input, at::kBFloat16);
  const CpuIsa isa = active_cpu_isa();
  const float* src = in.const_data_ptr<float>();
  auto* dst = reinterpret_cast<uint16_t*>(output.mutable_data_ptr<at::BFloat16>());
  at::parallel_for(0, in.numel(), kGrain, [&](int64_t begin, int64_t end) {
    const StochasticOptions options{static_cast<uint64_t>(seed),
                                    static_cast<uint64_t>(offset + begin)};
    cast_float_to_bf16_stochastic_cpu(src + begin, dst + begin, end - begin, options, isa);
  });
  return output;
}

// One chunk of a multi-tensor cast: elements [begin, end) of pair `pair`.
struct Chunk {
  size_t pair;
  int64_t begin;
  int64_t end;
};

at::Tensor multi_cast_cpu_op(at::TensorList inputs, at::TensorList outputs) {
  check_cast_lists(inputs, outputs);
  std::vector<CastOptions> options;
  std::vector<at::Tensor> sources, targets;
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < inputs.size(); ++i) {
    options.push_back(check_cast_pair(inputs[i], outputs[i], i, inputs[0].device()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    sources.push_back(inputs[i].contiguous());
    targets.push_back(outputs[i].is_contiguous()
                          ? outputs[i]
                          : empty_output(inputs[i], outputs[i].scalar_type()));
    for (int64_t begin = 0; begin < inputs[i].numel(); begin += kGrain) {
      chunks.push_back({i, begin, std::min(begin + kGrain, inputs[i].numel())});
    }
  }
  const CpuIsa isa = active_cpu_isa();
  std::atomic<bool> nonfinite{false};
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const Chunk& chunk = chunks[c];
      const at::Tensor& in = sources[chunk.pair];
      const auto* src =
          static_cast<const char*>(in.const_data_ptr()) + chunk.begin * in.element_size();
      auto* dst = static_cast<char*>(targets[chunk.pair].mutable_data_ptr()) +
                  chunk.begin * targets[chunk.pair].element_size();
      if (cast_cpu(src, dst, chunk.end - chunk.begin, options[chunk.pair], isa)) {
        nonfinite.store(true, std::memory_order_relaxed);
      }
    }
  });
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!targets[i].is_same(outputs[i])) {
      outputs[i].copy_(targets[i]);
    }
  }
  const at::Device device = inputs.empty() ? at::Device(at::kCPU) : inputs[0].device();
  return at::scalar_tensor(nonfinite.load(), at::TensorOptions(device).dtype(at::kBool));
}

}  // namespace
}  // namespace precision

// The C++ API: typed dispatcher calls, looked up once.
at::Tensor cast(const at::Tensor& input, at::ScalarType dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::cast", "")
                       .typed<at::Tensor(const at::Tensor&, at::ScalarType)>();
  return op.call(input, dtype);
}

at::Tensor cast_stochastic_bf16(const at::Tensor& input, int64_t seed, int64_t offset) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::cast_stochastic_bf16", "")
                       .typed<at::Tensor(const at::Tensor&, int64_t, int64_t)>();
  return op.call(input, seed, offset);
}

std::tuple<at::Tensor, at::Tensor> cast_check_finite(const at::Tensor& input,
                                                     at::ScalarType dtype) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("shardwise::cast_check_finite", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, at::ScalarType)>();
  return op.call(input, dtype);
}

at::Tensor multi_cast_(at::TensorList inputs, at::TensorList outputs) {
  if (inputs.empty() && outputs.empty()) {  // nothing to dispatch on, nothing to do
    return at::scalar_tensor(false, at::TensorOptions().dtype(at::kBool));
  }
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("shardwise::multi_cast_", "")
                       .typed<at::Tensor(at::TensorList, at::TensorList)>();
  return op.call(inputs, outputs);
}

TORCH_LIBRARY_IMPL(shardwise, CPU, m) {
  m.impl("cast", &precision::cast_cpu_op);
  m.impl("cast_check_finite", &precision::cast_check_finite_cpu_op);
  m.impl("cast_stochastic_bf16", &precision::cast_stochastic_bf16_cpu_op);
  m.impl("multi_cast_", &precision::multi_cast_cpu_op);
}

}  // namespace shardwise
