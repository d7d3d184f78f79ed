// The hierarchical all-reduce (collectives/allreduce_hierarchical.cc): which groups take it (at
// least two hosts, each with the same number, two or more, of ranks; hosts numbered in any
// order), and, on hosts of two ranks at world 4 (2 x 2) and 8 (4 x 2), every dtype and op against
// the flat algorithms in the same run: bit-identical where the data makes every reduction exact,
// and identical on every rank where it does not.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "collectives/collectives.h"
#include "collectives_harness.h"

namespace shardwise::collectives {
namespace {

using testing::error_text;
using testing::run_ranks;
using testing::TransportKind;

// A transport that only answers who it is and where its ranks sit.
class Placed : public Transport {
 public:
  Placed(int rank, std::vector<int> hosts) : rank_(rank), hosts_(std::move(hosts)) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(hosts_.size()); }
  std::vector<int> host_of() const override { return hosts_; }
  void sendrecv(
      int, ConstBuffer, int, size_t, const RecvConsumer&, Tag, Clock::time_point) override {
    throw std::logic_error("not a link");
  }
  void abort(const std::string&) override {}

 private:
  int rank_;
  std::vector<int> hosts_;
};

TEST(HostLayout, OnlyEvenMultiHostGroupsAreHierarchical) {
  EXPECT_FALSE(detail::host_layout(Placed(0, {})));               // every link alike
  EXPECT_FALSE(detail::host_layout(Placed(0, {0, 0, 0, 0})));     // one host
  EXPECT_FALSE(detail::host_layout(Placed(0, {0, 1, 2, 3})));     // one rank per host: flat
  EXPECT_FALSE(detail::host_layout(Placed(0, {0, 0, 0, 1, 1})));  // uneven hosts
  const auto layout = detail::host_layout(Placed(5, {1, 0, 2, 1, 0, 2}));  // hosts in any order
  ASSERT_TRUE(layout);
  EXPECT_EQ(layout->local, (std::vector<int>{2, 5}));
  EXPECT_EQ(layout->across, (std::vector<int>{4, 3, 5}));  // local rank 1 of hosts 0, 1, 2
}

CollectiveOptions options_for(Datatype dtype, ReduceOp op, bool hierarchical, uint64_t sequence) {
  CollectiveOptions options;
  options.dtype = dtype;
  options.op = op;
  options.hierarchical = hierarchical;
  options.tag.sequence = sequence;
  options.max_segment_bytes = 256;  // many slabs and segments
  options.small_message_bytes = 64;
  options.deadline = Clock::now() + std::chrono::seconds(60);
  return options;
}

// Values in {-1, 0, 1} (as the dtype's bytes): every op at world 8 is exact in every dtype.
std::vector<uint8_t> exact_data(Datatype dtype, int rank, size_t count) {
  const size_t element = element_size(dtype);
  std::vector<uint8_t> bytes(count * element);
  for (size_t i = 0; i < count; ++i) {
    const int v = static_cast<int>((i * 7 + static_cast<size_t>(rank)) % 3) - 1;
    uint8_t* at = bytes.data() + i * element;
    switch (dtype) {
      case Datatype::kFloat32: {
        const float x = static_cast<float>(v);
        std::memcpy(at, &x, 4);
        break;
      }
      case Datatype::kFloat64: {
        const double x = v;
        std::memcpy(at, &x, 8);
        break;
      }
      case Datatype::kBFloat16: {
        const uint16_t x = v == 0 ? 0 : (v > 0 ? 0x3f80 : 0xbf80);
        std::memcpy(at, &x, 2);
        break;
      }
      case Datatype::kFloat16: {
        const uint16_t x = v == 0 ? 0 : (v > 0 ? 0x3c00 : 0xbc00);
        std::memcpy(at, &x, 2);
        break;
      }
      case Datatype::kInt8: {
        const int8_t x = static_cast<int8_t>(v);
        std::memcpy(at, &x, 1);
        break;
      }
      case Datatype::kUInt8:
      case Datatype::kBool: {
        at[0] = static_cast<uint8_t>(v + 1 > 1);
        break;
      }
      case Datatype::kInt32: {
        const int32_t x = v;
        std::memcpy(at, &x, 4);
        break;
      }
      case Datatype::kInt64: {
        const int64_t x = v;
        std::memcpy(at, &x, 8);
        break;
      }
    }
  }
  return bytes;
}

struct Run {
  int world;
  size_t count;
};

class Hierarchical : public ::testing::TestWithParam<Run> {};

TEST_P(Hierarchical, EveryDtypeAndOpMatchesTheFlatAlgorithmsBitForBit) {
  const auto [world, count] = GetParam();
  const std::vector<Datatype> dtypes = {Datatype::kFloat32, Datatype::kFloat64, Datatype::kBFloat16,
                                        Datatype::kFloat16, Datatype::kInt8,    Datatype::kUInt8,
                                        Datatype::kInt32,   Datatype::kInt64,   Datatype::kBool};
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct,
                                     ReduceOp::kMin, ReduceOp::kMax};
  // results[rank][case]: hierarchical, then flat, per (dtype, op)
  std::vector<std::vector<std::vector<uint8_t>>> results(world);
  const auto errors =
      run_ranks(TransportKind::kHybridPairs, world, [&, count = count](Transport& t) {
        uint64_t sequence = 0;
        for (Datatype dtype : dtypes) {
          for (ReduceOp op : ops) {
            if (op == ReduceOp::kAvg && !is_floating(dtype)) continue;
            for (bool hierarchical : {true, false}) {
              std::vector<uint8_t> data = exact_data(dtype, t.rank(), count);
              allreduce(t, data.data(), count, options_for(dtype, op, hierarchical, sequence++));
              results[t.rank()].push_back(std::move(data));
            }
          }
        }
      });
  for (int r = 0; r < world; ++r) ASSERT_EQ(error_text(errors[r]), "") << "rank " << r;
  for (size_t c = 0; c < results[0].size(); c += 2) {
    EXPECT_EQ(results[0][c], results[0][c + 1]) << "case " << c / 2 << ": hierarchical vs flat";
    for (int r = 1; r < world; ++r) EXPECT_EQ(results[r][c], results[0][c]) << "rank " << r;
  }
}

TEST_P(Hierarchical, InexactSumsAreIdenticalOnEveryRank) {
  const auto [world, count] = GetParam();
  std::vector<std::vector<float>> results(world);
  const auto errors =
      run_ranks(TransportKind::kHybridPairs, world, [&, count = count](Transport& t) {
        std::mt19937 random(static_cast<uint32_t>(t.rank()));
        std::normal_distribution<float> normal(0.f, 1e3f);
        std::vector<float> data(count);
        for (float& x : data) x = normal(random);
        allreduce(t, data.data(), count, options_for(Datatype::kFloat32, ReduceOp::kSum, true, 0));
        results[t.rank()] = data;
      });
  for (int r = 0; r < world; ++r) ASSERT_EQ(error_text(errors[r]), "") << "rank " << r;
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[r], results[0]) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    HostsOfTwo,
    Hierarchical,
    ::testing::Values(Run{4, 1}, Run{4, 7}, Run{4, 1001}, Run{8, 13}, Run{8, 5000}),
    [](const ::testing::TestParamInfo<Run>& info) {
      return "world" + std::to_string(info.param.world) + "_count" +
             std::to_string(info.param.count);
    });

}  // namespace
}  // namespace shardwise::collectives
