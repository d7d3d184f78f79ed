#include "fsdp/quantized_messages.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace shardwise::fsdp {
namespace {

int64_t blocks_of(int64_t numel, int64_t block) { return (numel + block - 1) / block; }

}  // namespace

int64_t quantized_message_bytes(int64_t numel, int64_t block) {
  return numel + 4 * blocks_of(numel, block);
}

at::Tensor quantize_rows(const at::Tensor& rows, int64_t block) {
  TORCH_CHECK_VALUE(block > 0, "quantize_rows: block must be positive, got ", block);
  TORCH_CHECK_VALUE(rows.dim() == 2, "quantize_rows: rows must be 2-D, got ", rows.dim(), "-D");
  const int64_t count = rows.size(0), numel = rows.size(1), blocks = blocks_of(numel, block);
  // Each row in fp32, zero-padded to whole blocks (a pad never raises a block's max).
  at::Tensor x = at::zeros({count, blocks * block}, rows.options().dtype(at::kFloat));
  x.narrow(1, 0, numel).copy_(rows);
  const at::Tensor values = x.view({count, blocks, block});
  const at::Tensor scale = values.abs().amax(2).div_(127);  // count x blocks
  const at::Tensor divisor = at::where(scale > 0, scale, at::ones_like(scale));
  const at::Tensor q =
      values.div(divisor.unsqueeze(2)).round_().clamp_(-127, 127).to(at::kChar).view({count, -1});
  at::Tensor messages =
      at::empty({count, quantized_message_bytes(numel, block)}, rows.options().dtype(at::kByte));
  messages.narrow(1, 0, numel).copy_(q.narrow(1, 0, numel).view(at::kByte));
  messages.narrow(1, numel, 4 * blocks).copy_(scale.view(at::kByte));
  return messages;
}

at::Tensor dequantize_rows(const at::Tensor& messages,
                           int64_t numel,
                           at::ScalarType dtype,
                           int64_t block) {
  const int64_t blocks = blocks_of(numel, block), bytes = quantized_message_bytes(numel, block);
  TORCH_CHECK_VALUE(messages.numel() % bytes == 0, "dequantize_rows: ", messages.numel(),
                    " bytes are no whole number of messages of ", bytes);
  const int64_t count = messages.numel() / bytes;
  const at::Tensor rows = messages.reshape({count, bytes});
  // clone(): each part alone and contiguous, so the scales' bytes can be read as fp32
  const at::Tensor scales = rows.narrow(1, numel, 4 * blocks).clone().view(at::kFloat);
  at::Tensor q = at::zeros({count, blocks * block}, messages.options().dtype(at::kFloat));
  q.narrow(1, 0, numel).copy_(rows.narrow(1, 0, numel).clone().view(at::kChar));
  q.view({count, blocks, block}).mul_(scales.view({count, blocks, 1}));
  return q.narrow(1, 0, numel).to(dtype).contiguous();
}

}  // namespace shardwise::fsdp
