// CUDA implementations of the casting ops: ATen glue around the launchers of cast_cuda.cu. Work
// is queued on the current stream; the non-finite flag stays on the device (no synchronisation).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <map>
#include <utility>

#include "precision/cast_checks.h"
#include "precision/cast_kernels.h"

namespace shardwise::precision {
namespace {

void* current_stream() { return static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()); }

CastSpan span_of(const at::Tensor& input, at::Tensor& output) {
  return {input.const_data_ptr(), output.mutable_data_ptr(), input.numel()};
}

std::pair<at::Tensor, at::Tensor> cast_with_flag(const char* op,
                                                 const at::Tensor& input,
                                                 at::ScalarType dtype,
                                                 bool check) {
  CastOptions options = check_cast(op, input, dtype);
  options.check_nonfinite = check;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor in = input.contiguous();
  at::Tensor output = at::empty(input.sizes(), input.options().dtype(dtype));
  // Only a checking cast pays for the flag (an allocation and a fill launch).
  at::Tensor flag = check ? at::zeros({}, input.options().dtype(at::kInt)) : at::Tensor();
  cast_cuda(span_of(in, output), options, check ? flag.mutable_data_ptr<int32_t>() : nullptr,
            current_stream());
  return {output, flag};
}

at::Tensor cast_cuda_op(const at::Tensor& input, at::ScalarType dtype) {
  return cast_with_flag("shardwise.cast", input, dtype, false).first;
}

std::tuple<at::Tensor, at::Tensor> cast_check_finite_cuda_op(const at::Tensor& input,
                                                             at::ScalarType dtype) {
  auto [output, flag] = cast_with_flag("shardwise.cast_check_finite", input, dtype, true);
  return {output, flag.ne(0)};
}

at::Tensor cast_stochastic_bf16_cuda_op(const at::Tensor& input, int64_t seed, int64_t offset) {
  check_stochastic(input, offset);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor in = input.contiguous();
  at::Tensor output = at::empty(input.sizes(), input.options().dtype(at::kBFloat16));
  cast_float_to_bf16_stochastic_cuda(
      in.const_data_ptr<float>(), reinterpret_cast<uint16_t*>(output.mutable_data_ptr()),
      in.numel(), {static_cast<uint64_t>(seed), static_cast<uint64_t>(offset)}, current_stream());
  return output;
}

at::Tensor multi_cast_cuda_op(at::TensorList inputs, at::TensorList outputs) {
  check_cast_lists(inputs, outputs);
  std::vector<CastOptions> options;
  for (size_t i = 0; i < inputs.size(); ++i) {
    options.push_back(check_cast_pair(inputs[i], outputs[i], i, inputs[0].device()));
  }
  const c10::cuda::CUDAGuard guard(inputs[0].device());
  std::vector<at::Tensor> sources, targets;
  std::map<std::pair<Format, Format>, std::vector<CastSpan>> groups;  // one launch per pair
  for (size_t i = 0; i < inputs.size(); ++i) {
    sources.push_back(inputs[i].contiguous());
    targets.push_back(outputs[i].is_contiguous()
                          ? outputs[i]
                          : at::empty(inputs[i].sizes(), outputs[i].options()));
    groups[{options[i].src, options[i].dst}].push_back(span_of(sources[i], targets[i]));
  }
  at::Tensor flag = at::zeros({}, inputs[0].options().dtype(at::kInt));
  for (const auto& [formats, spans] : groups) {
    const CastOptions group_options{formats.first, formats.second, true};
    cast_many_cuda(spans.data(), static_cast<int64_t>(spans.size()), group_options,
                   flag.mutable_data_ptr<int32_t>(), current_stream());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!targets[i].is_same(outputs[i])) {
      outputs[i].copy_(targets[i]);
    }
  }
  return flag.ne(0);
}

}  // namespace

TORCH_LIBRARY_IMPL(shardwise, CUDA, m) {
  m.impl("cast", &cast_cuda_op);
  m.impl("cast_check_finite", &cast_check_finite_cuda_op);
  m.impl("cast_stochastic_bf16", &cast_stochastic_bf16_cuda_op);
  m.impl("multi_cast_", &multi_cast_cuda_op);
}

}  // namespace shardwise::precision
