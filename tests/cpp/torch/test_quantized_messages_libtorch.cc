// ZeRO++'s quantized messages (fsdp/quantized_messages.h), the format qwZ's all-gather and qgZ's
// all-to-all send: the round trip's error bound per block, blocks that never straddle two rows,
// zeros, the message size, and inputs in every floating dtype.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/quantized_messages.h"

namespace {

using shardwise::fsdp::dequantize_rows;
using shardwise::fsdp::kQuantizedBlock;
using shardwise::fsdp::quantize_rows;
using shardwise::fsdp::quantized_message_bytes;

// Each value comes back within half its block's largest magnitude / 127 (plus fp32 rounding).
void expect_within_block_bound(const at::Tensor& rows, const at::Tensor& back, int64_t block) {
  const int64_t numel = rows.size(1);
  for (int64_t r = 0; r < rows.size(0); ++r) {
    for (int64_t start = 0; start < numel; start += block) {
      const int64_t n = std::min(block, numel - start);
      const at::Tensor x = rows[r].narrow(0, start, n).to(at::kFloat);
      const at::Tensor y = back[r].narrow(0, start, n).to(at::kFloat);
      const double largest = x.abs().max().item<double>();
      const double error = (x - y).abs().max().item<double>();
      EXPECT_LE(error, largest / 254 + largest * 1e-6) << "row " << r << " block at " << start;
    }
  }
}

}  // namespace

// Catches a wrong scale (error above the bound) or a block read from the wrong row.
TEST(QuantizedMessages, RoundTripIsWithinHalfAStepOfEachBlock) {
  torch::manual_seed(0);
  for (const int64_t numel :
       {int64_t{1}, int64_t{100}, kQuantizedBlock, 3 * kQuantizedBlock + 17}) {
    // Rows of very different magnitudes: a block straddling two rows would take the larger's
    // scale and lose the smaller row entirely.
    const at::Tensor rows =
        torch::randn({3, numel}) * torch::tensor({1e-3f, 1.0f, 1e3f}).view({3, 1});
    const at::Tensor messages = quantize_rows(rows);
    ASSERT_EQ(messages.scalar_type(), at::kByte);
    ASSERT_EQ(messages.size(0), 3);
    ASSERT_EQ(messages.size(1), quantized_message_bytes(numel));
    const at::Tensor back = dequantize_rows(messages, numel, at::kFloat);
    ASSERT_EQ(back.sizes(), rows.sizes());
    expect_within_block_bound(rows, back, kQuantizedBlock);
    if (numel > 1) EXPECT_FALSE(at::equal(back, rows));  // it is quantized
  }
}

// The message: n int8 values and one fp32 scale per started block.
TEST(QuantizedMessages, MessageBytes) {
  EXPECT_EQ(quantized_message_bytes(1), 1 + 4);
  EXPECT_EQ(quantized_message_bytes(kQuantizedBlock), kQuantizedBlock + 4);
  EXPECT_EQ(quantized_message_bytes(kQuantizedBlock + 1), kQuantizedBlock + 1 + 8);
  EXPECT_EQ(quantized_message_bytes(10, 4), 10 + 12);
}

// Catches a division by a zero scale (NaN) in a block of zeros, and the largest value not
// landing exactly on +-127 steps.
TEST(QuantizedMessages, ZerosAndTheLargestValueComeBackExactly) {
  at::Tensor rows = torch::zeros({2, 3000});
  rows[1][5] = -2.5f;
  rows[1][2500] = 7.0f;
  const at::Tensor back = dequantize_rows(quantize_rows(rows), 3000, at::kFloat);
  EXPECT_TRUE(at::equal(back[0], rows[0]));
  EXPECT_FLOAT_EQ(back[1][5].item<float>(), -2.5f);
  EXPECT_FLOAT_EQ(back[1][2500].item<float>(), 7.0f);
  EXPECT_FALSE(back.isnan().any().item<bool>());
}

// Parameters in bf16 or fp16 quantize from their values and come back in the dtype asked for;
// messages concatenated (as an all-gather delivers them) read as rows.
TEST(QuantizedMessages, LowPrecisionInputsAndConcatenatedMessages) {
  torch::manual_seed(1);
  for (const auto dtype : {at::kBFloat16, at::kHalf, at::kDouble}) {
    const at::Tensor rows = torch::randn({4, 5000}).to(dtype);
    const at::Tensor flat = quantize_rows(rows).reshape(-1);
    const at::Tensor back = dequantize_rows(flat, 5000, dtype);
    ASSERT_EQ(back.scalar_type(), dtype);
    const at::Tensor again = dequantize_rows(flat, 5000, at::kFloat);
    expect_within_block_bound(rows.to(at::kFloat), again, kQuantizedBlock);
  }
  EXPECT_THROW(dequantize_rows(torch::zeros({7}, at::kByte), 5000, at::kFloat), c10::ValueError);
}
