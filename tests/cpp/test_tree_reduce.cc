// The deterministic reductions (tree_allreduce, tree_reduce_scatter) with PairwiseSum: for
// leaves whose values span 60 binary orders of magnitude (so the association of every addition
// shows in the bits), a global batch of 16 leaves summed at world 1, 2, 4 and 8 over every
// transport gives the one-rank pairwise sum bit for bit, whether each rank first adds its
// contiguous block of leaves or the ranks reduce one leaf each per accumulation step. The
// ordinary ring all-reduce does not (checked, so the inputs do exercise the association).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/pairwise_sum.h"
#include "collectives_harness.h"
#include "precision/cast_math.h"

namespace shardwise::collectives {
namespace {

using testing::error_text;
using testing::run_ranks;
using testing::TransportKind;

constexpr int kLeaves = 16;

using Vec = std::vector<float>;

// Leaf m, element i: +-(1 + f) * 2^e with e in [-30, 30], from a fixed linear congruence.
Vec leaf(int m, size_t count) {
  Vec v(count);
  uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(m + 1);
  for (size_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int e = static_cast<int>((state >> 33) % 61) - 30;
    const float f = static_cast<float>((state >> 12) & 0xfffff) / float(1 << 20);
    v[i] = std::ldexp((state >> 63) ? -(1.0f + f) : 1.0f + f, e);
  }
  return v;
}

Vec add(Vec a, Vec b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

using Pairwise = PairwiseSum<Vec, decltype(&add)>;

Vec pairwise(int first, int last, size_t count) {  // leaves [first, last)
  Pairwise sum(&add);
  for (int m = first; m < last; ++m) sum.push(leaf(m, count));
  return sum.finish();
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

CollectiveOptions options_for(Datatype dtype = Datatype::kFloat32) {
  CollectiveOptions o;
  o.dtype = dtype;
  o.max_segment_bytes = 256;  // many pieces and segments
  o.deadline = Clock::now() + std::chrono::seconds(60);
  return o;
}

struct Case {
  TransportKind kind;
  int world;
  size_t count;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(testing::kind_label(info.param.kind)) + "_world" +
         std::to_string(info.param.world) + "_count" + std::to_string(info.param.count);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (TransportKind kind : {TransportKind::kInProcess, TransportKind::kShm, TransportKind::kTcp,
                             TransportKind::kHybrid}) {
    for (int world : {1, 2, 4, 8}) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{5000}}) {
        out.push_back({kind, world, count});
      }
    }
  }
  return out;
}

class TreeReduce : public ::testing::TestWithParam<Case> {};

TEST_P(TreeReduce, ContiguousBlocksThenAllreduceEqualOneRank) {
  const auto [kind, world, count] = GetParam();
  const Vec expected = pairwise(0, kLeaves, count);
  std::vector<Vec> results(world);
  const int per_rank = kLeaves / world;
  auto errors = run_ranks(kind, world, [&, count = count](Transport& t) {
    Vec mine = pairwise(t.rank() * per_rank, (t.rank() + 1) * per_rank, count);
    tree_allreduce(t, mine.data(), count, options_for());
    results[t.rank()] = mine;
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(error_text(errors[r]), "") << "rank " << r;
    EXPECT_TRUE(same_bits(results[r], expected)) << "rank " << r;
  }
}

TEST_P(TreeReduce, OneLeafPerRankPerStepThenPairwiseEqualOneRank) {
  const auto [kind, world, count] = GetParam();
  const Vec expected = pairwise(0, kLeaves, count);
  std::vector<Vec> gathered(world), scattered(world);
  auto errors = run_ranks(kind, world, [&, count = count](Transport& t) {
    Pairwise all(&add), mine(&add);
    const size_t share = count / world;  // reduce-scatter: the first share * world elements
    for (int step = 0; step < kLeaves / world; ++step) {
      Vec x = leaf(step * world + t.rank(), count);
      Vec piece(share);
      tree_reduce_scatter(t, x.data(), piece.data(), share, options_for());
      tree_allreduce(t, x.data(), count, options_for());
      all.push(x);
      mine.push(piece);
    }
    gathered[t.rank()] = all.finish();
    scattered[t.rank()] = mine.finish();
  });
  const size_t share = count / world;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(error_text(errors[r]), "") << "rank " << r;
    EXPECT_TRUE(same_bits(gathered[r], expected)) << "rank " << r;
    const Vec part(expected.begin() + r * share, expected.begin() + (r + 1) * share);
    EXPECT_TRUE(same_bits(scattered[r], part)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, TreeReduce, ::testing::ValuesIn(cases()), case_name);

TEST(TreeReduce, TheInputsExposeTheAssociation) {
  // The left fold (autograd's running +=) and the ring all-reduce at world 8 differ from the
  // tree somewhere: a test whose inputs summed the same in any order could not fail.
  const size_t count = 5000;
  const Vec expected = pairwise(0, kLeaves, count);
  Vec fold = leaf(0, count);
  for (int m = 1; m < kLeaves; ++m) fold = add(fold, leaf(m, count));
  EXPECT_FALSE(same_bits(fold, expected));
  std::vector<Vec> ring(8);
  auto errors = run_ranks(TransportKind::kInProcess, 8, [&](Transport& t) {
    Vec mine = pairwise(t.rank() * 2, t.rank() * 2 + 2, count);
    allreduce(t, mine.data(), count, options_for());
    ring[t.rank()] = mine;
  });
  EXPECT_EQ(error_text(errors[0]), "");
  EXPECT_FALSE(same_bits(ring[0], expected));
}

TEST(TreeReduce, Bfloat16AddsInFloat32AndRoundsOnce) {
  const size_t count = 777;
  const int world = 4;
  std::vector<std::vector<uint16_t>> inputs(world), results(world);
  std::vector<Vec> widened(world);
  for (int r = 0; r < world; ++r) {
    const Vec x = leaf(r, count);
    for (float v : x) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      inputs[r].push_back(precision::float_to_bf16_bits(bits));
      const uint32_t back = precision::bf16_to_float_bits(inputs[r].back());
      float w;
      std::memcpy(&w, &back, 4);
      widened[r].push_back(w);
    }
  }
  const Vec sum = add(add(widened[0], widened[1]), add(widened[2], widened[3]));
  auto errors = run_ranks(TransportKind::kInProcess, world, [&](Transport& t) {
    std::vector<uint16_t> mine = inputs[t.rank()];
    tree_allreduce(t, mine.data(), count, options_for(Datatype::kBFloat16));
    results[t.rank()] = mine;
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(error_text(errors[r]), "");
    for (size_t i = 0; i < count; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &sum[i], 4);
      ASSERT_EQ(results[r][i], precision::float_to_bf16_bits(bits)) << "rank " << r << " i " << i;
    }
  }
}

TEST(TreeReduce, RefusesGroupsThatAreNotAPowerOfTwoAndNonSums) {
  auto errors = run_ranks(TransportKind::kInProcess, 3, [&](Transport& t) {
    Vec x(5, 1.0f);
    tree_allreduce(t, x.data(), x.size(), options_for());
  });
  EXPECT_NE(error_text(errors[0]).find("power-of-two group size, got 3"), std::string::npos)
      << error_text(errors[0]);
  auto max_errors = run_ranks(TransportKind::kInProcess, 2, [&](Transport& t) {
    Vec x(5, 1.0f);
    CollectiveOptions o = options_for();
    o.op = ReduceOp::kMax;
    tree_allreduce(t, x.data(), x.size(), o);
  });
  EXPECT_NE(error_text(max_errors[0]).find("SUM or AVG"), std::string::npos);
}

TEST(PairwiseSum, AssociatesAsTheBalancedTreeAndFoldsTheRest) {
  // Strings record the association: 6 leaves are ((0+1)+(2+3)) then (4+5), added last.
  auto join = [](std::string a, std::string b) { return "(" + a + "+" + b + ")"; };
  PairwiseSum<std::string, decltype(join)> sum(join);
  for (int m = 0; m < 6; ++m) sum.push(std::to_string(m));
  EXPECT_EQ(sum.partial_sums(), 2u);
  EXPECT_EQ(sum.finish(), "(((0+1)+(2+3))+(4+5))");
  for (int m = 0; m < 7; ++m) sum.push(std::to_string(m));
  EXPECT_EQ(sum.finish(), "(((0+1)+(2+3))+((4+5)+6))");
  EXPECT_THROW(sum.finish(), std::logic_error);
}

}  // namespace
}  // namespace shardwise::collectives
