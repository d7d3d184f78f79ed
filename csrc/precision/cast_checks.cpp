#include "precision/cast_checks.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

namespace shardwise::precision {

Format format_of(at::ScalarType dtype, const char* op, const char* argument) {
  switch (dtype) {
    case at::kFloat:
      return Format::kFloat32;
    case at::kBFloat16:
      return Format::kBFloat16;
    case at::kHalf:
      return Format::kFloat16;
    default:
      TORCH_CHECK_TYPE(false, op, ": argument '", argument, "' has dtype ", dtype,
                       "; expected torch.float32, torch.bfloat16 or torch.float16");
  }
}

namespace {
constexpr const char* kSupported =
    "supported: float32 -> bfloat16, float32 -> float16, bfloat16 -> float32, "
    "float16 -> float32";
}

CastOptions check_cast(const char* op, const at::Tensor& input, at::ScalarType dtype) {
  CastOptions options;
  options.src = format_of(input.scalar_type(), op, "input");
  options.dst = format_of(dtype, op, "dtype");
  TORCH_CHECK_TYPE(is_supported_cast(options.src, options.dst), op, ": cannot cast 'input' of ",
                   "dtype ", input.scalar_type(), " to 'dtype' ", dtype, " (", kSupported, ")");
  return options;
}

void check_cast_lists(at::TensorList inputs, at::TensorList outputs) {
  TORCH_CHECK_VALUE(inputs.size() == outputs.size(), "shardwise.multi_cast_: 'inputs' has ",
                    inputs.size(), " tensors but 'outputs' has ", outputs.size(),
                    "; pass one output per input");
}

CastOptions check_cast_pair(const at::Tensor& input,
                            const at::Tensor& output,
                            size_t index,
                            const at::Device& device) {
  const char* op = "shardwise.multi_cast_";
  TORCH_CHECK(input.device() == device, op, ": inputs[", index, "] is on ", input.device(),
              " but inputs[0] is on ", device, "; move every tensor to one device");
  TORCH_CHECK(output.device() == device, op, ": outputs[", index, "] is on ", output.device(),
              " but inputs[", index, "] is on ", device, "; allocate the output on ", device);
  TORCH_CHECK_VALUE(output.sizes() == input.sizes(), op, ": outputs[", index, "] has shape ",
                    output.sizes(), " but inputs[", index, "] has shape ", input.sizes(),
                    "; allocate outputs[", index, "] with the input's shape");
  CastOptions options;
  options.src = format_of(input.scalar_type(), op, "inputs");
  options.dst = format_of(output.scalar_type(), op, "outputs");
  TORCH_CHECK_TYPE(is_supported_cast(options.src, options.dst), op, ": cannot cast inputs[", index,
                   "] of dtype ", input.scalar_type(), " into outputs[", index, "] of dtype ",
                   output.scalar_type(), " (", kSupported, ")");
  at::assert_no_internal_overlap(output);
  at::assert_no_overlap(output, input);
  options.check_nonfinite = true;
  return options;
}

void check_stochastic(const at::Tensor& input, int64_t offset) {
  TORCH_CHECK_TYPE(input.scalar_type() == at::kFloat,
                   "shardwise.cast_stochastic_bf16: argument 'input' has dtype ",
                   input.scalar_type(), "; expected torch.float32");
  TORCH_CHECK_VALUE(offset >= 0, "shardwise.cast_stochastic_bf16: argument 'offset' is ", offset,
                    "; pass a counter offset >= 0");
}

}  // namespace shardwise::precision
