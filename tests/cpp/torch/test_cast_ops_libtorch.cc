// The casting ops called from LibTorch, the way a C++ training program uses them: through the
// C++ API of precision/cast_ops.h (dispatcher calls, autograd included), compared with
// at::Tensor::to, which is the reference of the Python tests too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "precision/cast_ops.h"

namespace {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         at::equal(a.view(at::kShort), b.view(at::kShort));
}

}  // namespace

TEST(CastOpsLibTorch, MatchesTensorToBitForBit) {
  torch::manual_seed(0);
  const at::Tensor x = torch::randn({37, 129}) * 1e3;
  EXPECT_TRUE(same_bits(shardwise::cast(x, at::kBFloat16), x.to(at::kBFloat16)));
  EXPECT_TRUE(same_bits(shardwise::cast(x, at::kHalf), x.to(at::kHalf)));
  const at::Tensor h = x.to(at::kHalf);
  EXPECT_TRUE(at::equal(shardwise::cast(h, at::kFloat), h.to(at::kFloat)));
}

TEST(CastOpsLibTorch, GradientIsTheReverseCast) {
  const at::Tensor x = torch::randn({64}, torch::requires_grad());
  const at::Tensor y = shardwise::cast(x, at::kBFloat16);
  const at::Tensor upstream = torch::randn({64}).to(at::kBFloat16);
  y.backward(upstream);
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(x.grad(), upstream.to(at::kFloat)));
}

TEST(CastOpsLibTorch, CheckFiniteAndMultiCast) {
  at::Tensor x = torch::ones({100});
  auto [out, found] = shardwise::cast_check_finite(x, at::kHalf);
  EXPECT_FALSE(found.item<bool>());
  x[50] = 1e6;  // overflows float16
  std::tie(out, found) = shardwise::cast_check_finite(x, at::kHalf);
  EXPECT_TRUE(found.item<bool>());

  std::vector<at::Tensor> inputs = {torch::randn({5}), torch::randn({3, 4})};
  std::vector<at::Tensor> outputs = {torch::empty({5}, at::kBFloat16),
                                     torch::empty({3, 4}, at::kHalf)};
  EXPECT_FALSE(shardwise::multi_cast_(inputs, outputs).item<bool>());
  EXPECT_TRUE(same_bits(outputs[0], inputs[0].to(at::kBFloat16)));
  EXPECT_TRUE(same_bits(outputs[1], inputs[1].to(at::kHalf)));
  EXPECT_FALSE(shardwise::multi_cast_({}, {}).item<bool>());
}

TEST(CastOpsLibTorch, ErrorsNameTheArgument) {
  try {
    shardwise::cast(torch::ones({2}, at::kInt), at::kBFloat16);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'input'"), std::string::npos) << e.what();
  }
}
