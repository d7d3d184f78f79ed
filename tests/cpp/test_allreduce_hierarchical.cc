// The hierarchical collectives (collectives/*_hierarchical.cc): which groups take them (at least
// two hosts, each with the same number, two or more, of ranks; hosts numbered in any order), and,
// on hosts of two ranks at world 4 (2 x 2) and 8 (4 x 2), with each host's ranks consecutive or
// strided, every dtype and op of all-reduce, reduce-scatter and all-gather against the flat
// algorithms in the same run: bit-identical where the data makes every reduction exact, and
// identical on every rank where it does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
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
  EXPECT_EQ(layout->hosts, (std::vector<std::vector<int>>{{1, 4}, {0, 3}, {2, 5}}));
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
  options.grouped_block_bytes = 64;  // reduce-scatter: blocks of 1-16 floats grouped, others not
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
  TransportKind kind;
};

const std::vector<Datatype> kDtypes = {Datatype::kFloat32, Datatype::kFloat64, Datatype::kBFloat16,
                                       Datatype::kFloat16, Datatype::kInt8,    Datatype::kUInt8,
                                       Datatype::kInt32,   Datatype::kInt64,   Datatype::kBool};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct,
                                    ReduceOp::kMin, ReduceOp::kMax};

// Runs `collective(transport, dtype, options)` hierarchically, then flat, for every dtype and
// every one of `ops` (AVG on floating types only), on every rank of `run`; expects the two
// results of each case bit-identical, and `identical_on_ranks` results the same on every rank.
using Collective =
    std::function<std::vector<uint8_t>(Transport&, Datatype, const CollectiveOptions&)>;
void expect_hierarchical_matches_flat(const Run& run,
                                      const std::vector<ReduceOp>& ops,
                                      bool identical_on_ranks,
                                      const Collective& collective) {
  // results[rank][case]: hierarchical, then flat, per (dtype, op)
  std::vector<std::vector<std::vector<uint8_t>>> results(run.world);
  const auto errors = run_ranks(run.kind, run.world, [&](Transport& t) {
    uint64_t sequence = 0;
    for (Datatype dtype : kDtypes) {
      for (ReduceOp op : ops) {
        if (op == ReduceOp::kAvg && !is_floating(dtype)) continue;
        for (bool hierarchical : {true, false}) {
          results[t.rank()].push_back(
              collective(t, dtype, options_for(dtype, op, hierarchical, sequence++)));
        }
      }
    }
  });
  for (int r = 0; r < run.world; ++r) ASSERT_EQ(error_text(errors[r]), "") << "rank " << r;
  for (int r = 0; r < run.world; ++r) {
    for (size_t c = 0; c < results[r].size(); c += 2) {
      EXPECT_EQ(results[r][c], results[r][c + 1])
          << "rank " << r << ", case " << c / 2 << ": hierarchical vs flat";
      if (identical_on_ranks) EXPECT_EQ(results[r][c], results[0][c]) << "rank " << r;
    }
  }
}

class Hierarchical : public ::testing::TestWithParam<Run> {};

TEST_P(Hierarchical, EveryDtypeAndOpMatchesTheFlatAlgorithmsBitForBit) {
  const size_t count = GetParam().count;
  expect_hierarchical_matches_flat(
      GetParam(), kOps, true,
      [count](Transport& t, Datatype dtype, const CollectiveOptions& options) {
        std::vector<uint8_t> data = exact_data(dtype, t.rank(), count);
        allreduce(t, data.data(), count, options);
        return data;
      });
}

// Each rank's input is every block's; block b differs from rank to rank. Counts are capped at
// 777 (many segments still) to keep world 8's thousands of TCP round trips short.
TEST_P(Hierarchical, ReduceScatterMatchesTheFlatRingBitForBit) {
  const size_t count = std::min<size_t>(GetParam().count, 777);
  const size_t world = static_cast<size_t>(GetParam().world);
  expect_hierarchical_matches_flat(
      GetParam(), kOps, false,
      [count, world](Transport& t, Datatype dtype, const CollectiveOptions& options) {
        const std::vector<uint8_t> input = exact_data(dtype, t.rank(), world * count);
        std::vector<uint8_t> output(count * element_size(dtype), 0xAB);
        reduce_scatter(t, input.data(), output.data(), count, options);
        return output;
      });
}

// Block b of the output is rank b's input (all-gather has no op). The inputs differ from case to
// case: the hierarchical run of a case has sequence 2k, its flat run 2k + 1. Counts capped as
// for reduce-scatter.
TEST_P(Hierarchical, AllGatherPlacesEveryRanksInputInItsBlock) {
  const size_t count = std::min<size_t>(GetParam().count, 777);
  const int world = GetParam().world;
  auto input_of = [count](int rank, const CollectiveOptions& options) {
    std::vector<uint8_t> bytes(count * element_size(options.dtype));
    const uint64_t which = options.tag.sequence / 2;
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<uint8_t>(i * 31 + static_cast<size_t>(rank) * 7 + which * 3 + 1);
    }
    return bytes;
  };
  expect_hierarchical_matches_flat(
      GetParam(), {ReduceOp::kSum}, true,
      [&](Transport& t, Datatype, const CollectiveOptions& options) {
        const std::vector<uint8_t> input = input_of(t.rank(), options);
        std::vector<uint8_t> output(static_cast<size_t>(world) * input.size(), 0xAB);
        all_gather(t, input.data(), output.data(), count, options);
        for (int b = 0; b < world; ++b) {
          const auto first = output.begin() + static_cast<std::ptrdiff_t>(b * input.size());
          EXPECT_EQ(std::vector<uint8_t>(first, first + static_cast<std::ptrdiff_t>(input.size())),
                    input_of(b, options))
              << "rank " << t.rank() << ", block " << b;
        }
        return output;
      });
}

TEST_P(Hierarchical, InexactSumsAreIdenticalOnEveryRank) {
  const auto [world, count, kind] = GetParam();
  std::vector<std::vector<float>> results(world);
  const auto errors = run_ranks(kind, world, [&, count = count](Transport& t) {
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

INSTANTIATE_TEST_SUITE_P(HostsOfTwo,
                         Hierarchical,
                         ::testing::Values(Run{4, 1, TransportKind::kHybridPairs},
                                           Run{4, 7, TransportKind::kHybridPairs},
                                           Run{4, 1001, TransportKind::kHybridPairs},
                                           Run{8, 13, TransportKind::kHybridPairs},
                                           Run{8, 5000, TransportKind::kHybridPairs},
                                           Run{4, 301, TransportKind::kHybridStrided},
                                           Run{8, 777, TransportKind::kHybridStrided}),
                         [](const ::testing::TestParamInfo<Run>& info) {
                           return std::string(kind_label(info.param.kind)) + "_world" +
                                  std::to_string(info.param.world) + "_count" +
                                  std::to_string(info.param.count);
                         });

}  // namespace
}  // namespace shardwise::collectives
