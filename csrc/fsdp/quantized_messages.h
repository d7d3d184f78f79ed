// ZeRO++'s quantized messages: what a rank sends in place of a row of values, as int8 in blocks
// of kQuantizedBlock elements, each block with its own fp32 scale. Two collectives use them:
// the quantized parameter all-gather (qwZ: a rank's shard is one row) and the quantized gradient
// reduce-scatter (qgZ: the row for rank r is the gradient's chunk that rank r owns, sent by an
// all-to-all and summed by its owner in fp32).
//
// Symmetric per block: scale = max |x| / 127 over the block's elements (x in fp32), q = round(x /
// scale) (half to even), so a value comes back as q * scale, within scale / 2 of x; a block of
// zeros has scale 0 and comes back as zeros. Blocks never straddle two rows. Every receiver
// dequantizes the same bytes the same way, so ranks that receive the same messages hold
// bit-identical values. Only messages are quantized: whatever a rank keeps (the shards the
// optimizer steps, the reduced gradient) keeps its precision.
//
// The message of a row of n elements: the n int8 values, then ceil(n / block) fp32 scales
// (n + 4 ceil(n / block) bytes, about a quarter of the fp32 row's).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace shardwise::fsdp {

constexpr int64_t kQuantizedBlock = 2048;

// Bytes of the message of a row of `numel` elements.
int64_t quantized_message_bytes(int64_t numel, int64_t block = kQuantizedBlock);

// The messages (uint8, rows x quantized_message_bytes(numel)) of the rows of a 2-D tensor
// (rows x numel, any floating dtype).
at::Tensor quantize_rows(const at::Tensor& rows, int64_t block = kQuantizedBlock);

// Messages (uint8: a multiple of quantized_message_bytes(numel), rows of it concatenated, or
// 2-D) back to their rows: rows x numel in `dtype`.
at::Tensor dequantize_rows(const at::Tensor& messages,
                           int64_t numel,
                           at::ScalarType dtype,
                           int64_t block = kQuantizedBlock);

}  // namespace shardwise::fsdp
