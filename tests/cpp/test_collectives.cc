// The collective algorithms with threads as ranks, over in-process queues, a real shared-memory
// segment, TCP on loopback and the hybrid of the two, on two hosts or hosts of two (4 KiB rings,
// 256-byte segments, so small inputs wrap the rings and span many slabs): world 1..8 x counts
// {0, 1, 7, 1001 (not divisible), 5000 (many segments)}. Integer-valued float data makes every
// sum exact, so results are compared bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "collectives_harness.h"
#include "precision/cast_math.h"

namespace shardwise::collectives {
namespace {

using testing::error_text;
using testing::run_ranks;
using testing::TransportKind;

CollectiveOptions small_segments(Datatype dtype = Datatype::kFloat32,
                                 ReduceOp op = ReduceOp::kSum) {
  CollectiveOptions options;
  options.dtype = dtype;
  options.op = op;
  options.max_segment_bytes = 256;
  options.small_message_bytes = 64;
  options.deadline = Clock::now() + std::chrono::seconds(60);
  return options;
}

float value(int rank, size_t i) {
  return static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
}

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(error_text(errors[r]), "") << "rank " << r;
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

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (TransportKind kind :
       {TransportKind::kInProcess, TransportKind::kShm, TransportKind::kShmSingleCopy,
        TransportKind::kTcp, TransportKind::kHybrid, TransportKind::kHybridPairs}) {
    for (int world = 1; world <= 8; ++world) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}, size_t{5000}}) {
        cases.push_back({kind, world, count});
      }
    }
  }
  return cases;
}

class Collectives : public ::testing::TestWithParam<Case> {};

TEST_P(Collectives, AllreduceSumIsExactAndIdenticalEverywhere) {
  const auto [kind, world, count] = GetParam();
  std::vector<std::vector<float>> results(world);
  expect_no_errors(run_ranks(kind, world, [&, count = count](Transport& t) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = value(t.rank(), i);
    allreduce(t, data.data(), count, small_segments());
    results[t.rank()] = data;
  }));
  for (size_t i = 0; i < count; ++i) {
    float expected = 0;
    for (int r = 0; r < world; ++r) expected += value(r, i);
    ASSERT_EQ(results[0][i], expected) << i;
  }
  for (int r = 1; r < world && count > 0; ++r)  // (memcmp of empty vectors' null data is UB)
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), count * 4), 0);
}

TEST_P(Collectives, ReduceScatterAndAllGather) {
  const auto [kind, world, count] = GetParam();
  std::vector<std::vector<float>> scattered(world), gathered(world);
  expect_no_errors(run_ranks(kind, world, [&, count = count](Transport& t) {
    std::vector<float> input(count * world), output(count), all(count * world);
    for (size_t i = 0; i < input.size(); ++i) input[i] = value(t.rank(), i);
    CollectiveOptions options = small_segments();
    reduce_scatter(t, input.data(), output.data(), count, options);
    options.tag.sequence = 1;
    all_gather(t, output.data(), all.data(), count, options);
    scattered[t.rank()] = output;
    gathered[t.rank()] = all;
  }));
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      for (int source = 0; source < world; ++source) expected += value(source, r * count + i);
      ASSERT_EQ(scattered[r][i], expected) << "rank " << r << " element " << i;
      for (int other = 0; other < world; ++other)
        ASSERT_EQ(gathered[other][r * count + i], expected);
    }
  }
}

TEST_P(Collectives, BroadcastFromEveryRootAndAlltoall) {
  const auto [kind, world, count] = GetParam();
  expect_no_errors(run_ranks(kind, world, [&, count = count](Transport& t) {
    CollectiveOptions options = small_segments();
    for (int root = 0; root < world; ++root) {
      std::vector<float> data(count, t.rank() == root ? 0.f : -1.f);
      if (t.rank() == root)
        for (size_t i = 0; i < count; ++i) data[i] = value(root, i);
      options.tag.sequence = root;
      broadcast(t, data.data(), count * 4, root, options);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], value(root, i));
    }
    // Uneven all-to-all: rank r sends (count + p) floats to rank p.
    std::vector<size_t> send_off(world), send_n(world), recv_off(world), recv_n(world);
    size_t send_total = 0, recv_total = 0;
    for (int p = 0; p < world; ++p) {
      send_off[p] = send_total * 4, send_n[p] = (count + p) * 4, send_total += count + p;
      recv_off[p] = recv_total * 4, recv_n[p] = (count + t.rank()) * 4,
      recv_total += count + t.rank();
    }
    std::vector<float> in(send_total), out(recv_total, -1);
    for (int p = 0; p < world; ++p)
      for (size_t i = 0; i < count + p; ++i)
        in[send_off[p] / 4 + i] = value(t.rank(), p * 100000 + i);
    options.tag.sequence = 1000;
    alltoall(t, in.data(), send_off.data(), send_n.data(), out.data(), recv_off.data(),
             recv_n.data(), options);
    for (int p = 0; p < world; ++p)
      for (size_t i = 0; i < count + t.rank(); ++i)
        ASSERT_EQ(out[recv_off[p] / 4 + i], value(p, t.rank() * 100000 + i));
    options.tag.sequence = 1001;
    barrier(t, options);
  }));
}

INSTANTIATE_TEST_SUITE_P(Sweep, Collectives, ::testing::ValuesIn(all_cases()), case_name);

// Every dtype and reduce op at world 3 against a serial reduction in rank order.
TEST(CollectivesDtypes, EveryDtypeAndOp) {
  const int world = 3;
  const size_t count = 777;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<std::vector<int32_t>> ints(world);
    std::vector<std::vector<uint8_t>> bools(world);
    std::vector<std::vector<double>> doubles(world);
    expect_no_errors(run_ranks(TransportKind::kShm, world, [&](Transport& t) {
      std::vector<int32_t> i32(count);
      std::vector<uint8_t> b(count);
      std::vector<double> f64(count);
      for (size_t i = 0; i < count; ++i) {
        i32[i] = static_cast<int32_t>((i * 7 + t.rank() * 3) % 11) - 5;
        b[i] = ((i >> t.rank()) & 1) != 0;
        f64[i] = (i % 5 == 0 && t.rank() == 1) ? NAN : static_cast<double>(i % 13) - t.rank();
      }
      CollectiveOptions options = small_segments(Datatype::kInt32, op);
      allreduce(t, i32.data(), count, options);
      options.dtype = Datatype::kBool;
      options.tag.sequence = 1;
      allreduce(t, b.data(), count, options);
      options.dtype = Datatype::kFloat64;
      options.tag.sequence = 2;
      allreduce(t, f64.data(), count, options);
      ints[t.rank()] = i32, bools[t.rank()] = b, doubles[t.rank()] = f64;
    }));
    for (size_t i = 0; i < count; ++i) {
      int32_t expected_int = 0;
      bool expected_bool = false;
      double expected_double = 0;
      for (int r = 0; r < world; ++r) {
        const int32_t x = static_cast<int32_t>((i * 7 + r * 3) % 11) - 5;
        const bool y = ((i >> r) & 1) != 0;
        const double z = (i % 5 == 0 && r == 1) ? NAN : static_cast<double>(i % 13) - r;
        if (r == 0) {
          expected_int = x, expected_bool = y, expected_double = z;
          continue;
        }
        switch (op) {
          case ReduceOp::kSum:
            expected_int += x, expected_bool = expected_bool || y, expected_double += z;
            break;
          case ReduceOp::kProduct:
            expected_int *= x, expected_bool = expected_bool && y, expected_double *= z;
            break;
          case ReduceOp::kMin:
            expected_int = std::min(expected_int, x), expected_bool = expected_bool && y;
            expected_double =
                std::isnan(z) || std::isnan(expected_double) ? NAN : std::min(expected_double, z);
            break;
          default:
            expected_int = std::max(expected_int, x), expected_bool = expected_bool || y;
            expected_double =
                std::isnan(z) || std::isnan(expected_double) ? NAN : std::max(expected_double, z);
        }
      }
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(ints[r][i], expected_int) << reduce_op_name(op) << " " << i;
        ASSERT_EQ(bools[r][i] != 0, expected_bool) << reduce_op_name(op) << " " << i;
        if (std::isnan(expected_double)) {
          ASSERT_TRUE(std::isnan(doubles[r][i])) << reduce_op_name(op) << " " << i;
        } else {
          ASSERT_EQ(doubles[r][i], expected_double) << reduce_op_name(op) << " " << i;
        }
      }
    }
  }
}

// bfloat16 is summed in float32 and rounded once: equal to rounding the float32 sum.
TEST(CollectivesDtypes, Bf16AndAvgAccumulateInFloat32AndRoundOnce) {
  const int world = 4;
  const size_t count = 2000;
  std::vector<std::vector<uint16_t>> results(world), averages(world);
  auto input = [](int rank, size_t i) {
    return 1.0f + 0.001f * static_cast<float>(i) + 0.0001f * rank;
  };
  expect_no_errors(run_ranks(TransportKind::kShm, world, [&](Transport& t) {
    std::vector<uint16_t> data(count), avg(count);
    for (size_t i = 0; i < count; ++i)
      data[i] = avg[i] = precision::float_to_bf16_bits(precision::float_bits(input(t.rank(), i)));
    CollectiveOptions options = small_segments(Datatype::kBFloat16, ReduceOp::kSum);
    allreduce(t, data.data(), count, options);
    options.op = ReduceOp::kAvg;
    options.tag.sequence = 1;
    allreduce(t, avg.data(), count, options);
    results[t.rank()] = data, averages[t.rank()] = avg;
  }));
  for (size_t i = 0; i < count; ++i) {
    float sum = 0;  // ring order differs from rank order, but these float32 sums are exact
    for (int r = 0; r < world; ++r) {
      sum += precision::bits_float(precision::bf16_to_float_bits(
          precision::float_to_bf16_bits(precision::float_bits(input(r, i)))));
    }
    const uint16_t expected = precision::float_to_bf16_bits(precision::float_bits(sum));
    const uint16_t expected_avg = precision::float_to_bf16_bits(precision::float_bits(sum / world));
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(results[r][i], expected) << i;
      ASSERT_EQ(averages[r][i], expected_avg) << i;
    }
  }
}

// reduce_scatter of bfloat16 with AVG: float32 partial sums, one rounding, over shm, TCP and both.
TEST(CollectivesDtypes, Bf16ReduceScatterAvg) {
  const int world = 3;
  const size_t count = 1500;  // several 256-byte segments per block
  auto input = [](int rank, size_t i) { return 0.5f + 0.25f * static_cast<float>(i % 64) + rank; };
  for (TransportKind kind : {TransportKind::kShm, TransportKind::kShmSingleCopy,
                             TransportKind::kTcp, TransportKind::kHybrid}) {
    std::vector<std::vector<uint16_t>> outputs(world);
    expect_no_errors(run_ranks(kind, world, [&](Transport& t) {
      std::vector<uint16_t> in(count * world), out(count);
      for (size_t i = 0; i < in.size(); ++i) {
        in[i] = precision::float_to_bf16_bits(precision::float_bits(input(t.rank(), i)));
      }
      reduce_scatter(t, in.data(), out.data(), count,
                     small_segments(Datatype::kBFloat16, ReduceOp::kAvg));
      outputs[t.rank()] = out;
    }));
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < count; ++i) {
        float sum = 0;  // exact in float32: multiples of 1/4 below 2^8
        for (int source = 0; source < world; ++source) sum += input(source, r * count + i);
        ASSERT_EQ(outputs[r][i], precision::float_to_bf16_bits(precision::float_bits(sum / world)))
            << testing::kind_label(kind) << " rank " << r << " element " << i;
      }
    }
  }
}

TEST(CollectivesErrors, AvgOnIntegersIsRejectedBeforeAnyCommunication) {
  auto errors = run_ranks(TransportKind::kInProcess, 2, [](Transport& t) {
    int32_t x = 1;
    allreduce(t, &x, 1, small_segments(Datatype::kInt32, ReduceOp::kAvg));
  });
  for (auto& e : errors)
    EXPECT_NE(error_text(e).find("AVG is defined for floating dtypes"), std::string::npos);
}

class CollectivesFailures : public ::testing::TestWithParam<TransportKind> {};

TEST_P(CollectivesFailures, MismatchedCollectivesAreReportedNotHung) {
  auto errors = run_ranks(GetParam(), 2, [](Transport& t) {
    std::vector<float> data(t.rank() == 0 ? 100 : 50, 1.0f);  // different sizes
    CollectiveOptions options = small_segments();
    options.small_message_bytes = 1 << 20;
    options.deadline = Clock::now() + std::chrono::seconds(10);
    allreduce(t, data.data(), data.size(), options);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(error_text(errors[r]).find("mismatched collectives"), std::string::npos)
        << error_text(errors[r]);
  errors = run_ranks(GetParam(), 2, [](Transport& t) {  // same size, different sequence numbers
    float x = 1;
    CollectiveOptions options = small_segments();
    options.tag.sequence = t.rank() == 0 ? 7 : 8;
    options.deadline = Clock::now() + std::chrono::seconds(10);
    allreduce(t, &x, 1, options);
  });
  EXPECT_NE(error_text(errors[0]).find("unknown #7"), std::string::npos) << error_text(errors[0]);
}

TEST_P(CollectivesFailures, AMissingPeerTimesOutNamingIt) {
  const auto start = Clock::now();
  auto errors = run_ranks(GetParam(), 3, [](Transport& t) {
    if (t.rank() == 2) {  // alive, connected, but never joins the all-reduce
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return;
    }
    std::vector<float> data(1000, 1.0f);
    CollectiveOptions options = small_segments();
    options.deadline = Clock::now() + std::chrono::milliseconds(500);
    allreduce(t, data.data(), data.size(), options);
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  // Rank 0 receives from rank 2 in the ring; rank 1 then waits on rank 0.
  EXPECT_NE(error_text(errors[0]).find("Timed out waiting for rank 2"), std::string::npos)
      << error_text(errors[0]);
  // Rank 1 either times out on rank 0, learns that rank 0 failed (TCP: its sockets closed), or
  // (single copy, where a send ends only once the receiver has read it) times out on rank 2.
  const std::string second = error_text(errors[1]);
  EXPECT_TRUE(second.find("rank 0") != std::string::npos ||
              second.find("Timed out waiting for rank 2") != std::string::npos)
      << second;
}

// Every rank is named by its number in the group, whatever link carries it: over a hybrid
// transport ranks 2 and 3 are ranks 0 and 1 of their host's shared memory, which once named them
// so ("rank 1: Timed out waiting for rank 0").
TEST_P(CollectivesFailures, ATimeoutNamesRanksByTheirNumberInTheGroup) {
  auto errors = run_ranks(GetParam(), 4, [](Transport& t) {
    if (t.rank() != 3) {  // rank 2 stays connected but never sends
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      return;
    }
    float got = 0;
    t.sendrecv(-1, ConstBuffer{}, 2, Buffer{&got, sizeof(got)}, make_tag(Kind::kBroadcast, 5),
               Clock::now() + std::chrono::milliseconds(300));
  });
  const std::string text = error_text(errors[3]);
  EXPECT_EQ(text.rfind("rank 3: Timed out waiting for rank 2 in broadcast #5", 0), 0u) << text;
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(error_text(errors[rank]), "") << rank;
}

// Receive from any source (recv_any.cc over Transport::message_waiting): the peer whose message
// came first is named, a later one is still found, nothing is consumed by the probe, and a wait
// that hears nothing ends at its deadline with "Timed out".
TEST_P(CollectivesFailures, WaitForAnyNamesThePeerThatSentFirst) {
  auto errors = run_ranks(GetParam(), 3, [](Transport& t) {
    CollectiveOptions options;
    options.deadline = Clock::now() + std::chrono::seconds(20);
    options.tag = make_tag(Kind::kSendRecv, 0);
    if (t.rank() == 0) {
      std::vector<int> order;
      for (int k = 0; k < 2; ++k) {
        const int peer = wait_for_any(t, {1, 2}, options.deadline);
        float got[2] = {0, 0};
        recv(t, peer, got, sizeof(got), options);
        EXPECT_EQ(got[0], 10.0f * peer);
        EXPECT_EQ(got[1], 10.0f * peer + 1);
        order.push_back(peer);
        if (k == 0) {  // rank 1 sends only now: rank 2's message was the only one to find
          const float go = 1;
          send(t, 1, &go, sizeof(go), options);
        }
      }
      EXPECT_EQ(order, (std::vector<int>{2, 1}));
      const auto start = Clock::now();
      try {
        wait_for_any(t, {1, 2}, Clock::now() + std::chrono::milliseconds(200));
        ADD_FAILURE() << "a message that was never sent was found";
      } catch (const TransportError& e) {
        EXPECT_NE(std::string(e.what()).find("rank 0: Timed out waiting for a message from any of "
                                             "ranks 1, 2"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    } else {
      if (t.rank() == 1) {
        float go = 0;
        recv(t, 0, &go, sizeof(go), options);
      }
      const float mine[2] = {10.0f * t.rank(), 10.0f * t.rank() + 1};
      send(t, 0, mine, sizeof(mine), options);
    }
  });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(error_text(errors[r]), "") << "rank " << r;
}

TEST_P(CollectivesFailures, AbortFailsPeersFast) {
  const auto start = Clock::now();
  auto errors = run_ranks(GetParam(), 2, [](Transport& t) {
    if (t.rank() == 1) {
      t.abort("simulated failure");
      return;
    }
    float x = 1;
    CollectiveOptions options = small_segments();
    options.deadline = Clock::now() + std::chrono::seconds(30);
    allreduce(t, &x, 1, options);
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  // TCP carries no reason: the aborting rank shuts its sockets, which the peer sees at once.
  // Hybrid at world 2 puts the two ranks on different pretend hosts: TCP between them.
  const bool tcp = GetParam() == TransportKind::kTcp || GetParam() == TransportKind::kHybrid;
  const char* expected = tcp ? "peer rank 1 closed the connection" : "simulated failure";
  EXPECT_NE(error_text(errors[0]).find(expected), std::string::npos) << error_text(errors[0]);
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         CollectivesFailures,
                         ::testing::Values(TransportKind::kInProcess,
                                           TransportKind::kShm,
                                           TransportKind::kShmSingleCopy,
                                           TransportKind::kTcp,
                                           TransportKind::kHybrid),
                         [](const auto& info) { return testing::kind_label(info.param); });

}  // namespace
}  // namespace shardwise::collectives
