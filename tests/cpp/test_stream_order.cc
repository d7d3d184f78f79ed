// StreamOrder, the happens-before checker the FSDP unit's stream protocol is tested with on CPU:
// each rule fires on the protocol bug it exists for (a missing event wait, a missing
// record_stream, a use after free) and stays silent on the correct protocol, so the unit's
// recorded run (tests/cpp/torch/test_fsdp_lanes_libtorch.cc) passing means something.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fsdp/stream_order.h"

namespace shardwise::fsdp {
namespace {

constexpr int kCompute = 0, kGather = 1, kReduce = 2;
constexpr StreamOrder::Buffer kShard = 1, kInput = 2, kOutput = 3, kFull = 4;

StreamOrder lanes() { return StreamOrder({"compute", "all-gather", "reduce-scatter"}); }

bool mentions(const std::vector<std::string>& errors, const std::string& words) {
  for (const auto& e : errors) {
    if (e.find(words) != std::string::npos) return true;
  }
  return false;
}

// The unit's unshard: copy-in and all-gather on their lane, copy-out on compute after an event.
void unshard(StreamOrder& order, bool compute_waits, bool keep_output_alive) {
  order.wait(kGather, order.record(kCompute));
  order.allocate(kInput, kGather, "all-gather input");
  order.access(kGather, "copy-in", {kShard}, {kInput});
  order.allocate(kOutput, kGather, "all-gather output");
  order.access(kGather, "all-gather", {kInput}, {kOutput});
  const int gathered = order.record(kGather);
  order.free(kInput);
  if (compute_waits) order.wait(kCompute, gathered);
  order.allocate(kFull, kCompute, "unsharded parameters");
  order.access(kCompute, "copy-out", {kOutput}, {kFull});
  if (keep_output_alive) order.keep_alive(kOutput, kCompute);
  order.free(kOutput);
}

TEST(StreamOrder, TheUnitsProtocolHasNoErrors) {
  StreamOrder order = lanes();
  order.allocate(kShard, kCompute, "shard");
  for (int step = 0; step < 3; ++step) {
    unshard(order, /*compute_waits=*/true, /*keep_output_alive=*/true);
    order.access(kCompute, "forward", {kFull}, {});
    order.free(kFull);
    order.access(kCompute, "optimizer step", {}, {kShard});
  }
  EXPECT_TRUE(order.errors().empty()) << order.errors()[0];
  EXPECT_EQ(order.operations(), 15);
}

TEST(StreamOrder, AMissingWaitIsARace) {
  StreamOrder order = lanes();
  order.allocate(kShard, kCompute, "shard");
  unshard(order, /*compute_waits=*/false, /*keep_output_alive=*/true);
  ASSERT_EQ(order.errors().size(), 1u);
  EXPECT_TRUE(mentions(order.errors(),
                       "race on 'all-gather output': read by 'copy-out' on "
                       "compute is not ordered after 'all-gather' on all-gather"))
      << order.errors()[0];
}

TEST(StreamOrder, AWriteRacesWithAnUnorderedReadOnAnotherLane) {
  StreamOrder order = lanes();
  order.allocate(kShard, kCompute, "shard");
  order.wait(kGather, order.record(kCompute));
  order.access(kGather, "copy-in", {kShard}, {});
  order.access(kCompute, "optimizer step", {}, {kShard});  // the copy-in may not have read yet
  EXPECT_TRUE(mentions(order.errors(),
                       "write by 'optimizer step' on compute is not ordered after "
                       "'copy-in' on all-gather"));
}

TEST(StreamOrder, FreeingWithoutRecordStreamIsAnEarlyReuse) {
  StreamOrder order = lanes();
  order.allocate(kShard, kCompute, "shard");
  unshard(order, /*compute_waits=*/true, /*keep_output_alive=*/false);
  ASSERT_EQ(order.errors().size(), 1u);
  EXPECT_TRUE(mentions(order.errors(),
                       "early reuse of 'all-gather output' (allocated on "
                       "all-gather): freed while 'copy-out' on compute"));
}

TEST(StreamOrder, AnAllocationLaneThatWaitsOrAHostThatWaitedMakesTheFreeSafe) {
  StreamOrder order = lanes();
  order.allocate(kOutput, kGather, "output");
  order.access(kGather, "all-gather", {}, {kOutput});
  order.wait(kCompute, order.record(kGather));
  order.access(kCompute, "copy-out", {kOutput}, {});
  order.wait(kGather, order.record(kCompute));  // the allocation lane waits: reuse comes after
  order.free(kOutput);
  order.allocate(kInput, kReduce, "input");
  order.access(kCompute, "read", {kInput}, {});
  order.host_wait(order.record(kCompute));  // the host synchronized
  order.free(kInput);
  EXPECT_TRUE(order.errors().empty()) << order.errors()[0];
}

TEST(StreamOrder, WorkQueuedAfterAHostWaitIsOrderedAfterTheEvent) {
  StreamOrder order = lanes();
  order.allocate(kOutput, kReduce, "reduce output");
  order.access(kReduce, "reduce-scatter", {}, {kOutput});
  order.host_wait(order.record(kReduce));  // e.g. Work::wait on a blocking backend
  order.access(kCompute, "copy-out", {kOutput}, {});
  EXPECT_TRUE(order.errors().empty()) << order.errors()[0];
}

TEST(StreamOrder, UseAfterFreeAndDoubleFreeAreNamed) {
  StreamOrder order = lanes();
  order.allocate(kFull, kCompute, "unsharded parameters");
  order.free(kFull);
  order.access(kCompute, "forward", {kFull}, {});
  order.free(kFull);
  ASSERT_EQ(order.errors().size(), 2u);
  EXPECT_TRUE(mentions(order.errors(),
                       "use after free: 'forward' on compute touches 'unsharded "
                       "parameters'"));
  EXPECT_TRUE(mentions(order.errors(), "double free of 'unsharded parameters'"));
  order.allocate(kFull, kCompute, "unsharded parameters");  // allocated again: fine to use
  order.access(kCompute, "forward", {kFull}, {});
  EXPECT_EQ(order.errors().size(), 2u);
}

TEST(StreamOrder, BadLanesAndEventsThrow) {
  StreamOrder order = lanes();
  EXPECT_THROW(order.record(3), std::out_of_range);
  EXPECT_THROW(order.wait(0, 7), std::out_of_range);
  EXPECT_THROW(StreamOrder({}), std::invalid_argument);
}

}  // namespace
}  // namespace shardwise::fsdp
