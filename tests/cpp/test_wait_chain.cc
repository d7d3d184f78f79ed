// describe_wait_chain: the clause a timeout error appends, following whom each timed-out rank was
// waiting for, to the end of the chain or around a cycle.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "collectives/wait_chain.h"

namespace shardwise::collectives {
namespace {

std::string chain(int self, int peer, const std::vector<int>& waiting_for) {
  return describe_wait_chain(
      self, peer, static_cast<int>(waiting_for.size()), [&](int r) { return waiting_for.at(r); },
      [](int r) { return "rank " + std::to_string(r); });
}

TEST(WaitChain, APeerThatWasNotWaitingAddsNothing) { EXPECT_EQ(chain(0, 1, {1, -1, -1}), ""); }

TEST(WaitChain, FollowsEveryTimedOutRankToTheOneThatWasNot) {
  EXPECT_EQ(chain(0, 1, {1, 2, 3, -1}),
            "; rank 1 was itself timed out waiting for rank 2, rank 2 for rank 3 (the end of the "
            "chain of waits)");
}

TEST(WaitChain, ACycleEndsTheWalkAndIsNamed) {
  EXPECT_EQ(chain(0, 1, {1, 2, 0}),
            "; rank 1 was itself timed out waiting for rank 2, rank 2 for rank 0: a cycle of waits "
            "(did the ranks call collectives in different orders?)");
  EXPECT_EQ(chain(0, 1, {-1, 2, 1}),
            "; rank 1 was itself timed out waiting for rank 2, rank 2 for rank 1: a cycle of waits "
            "(did the ranks call collectives in different orders?)");
}

TEST(WaitChain, ARankOutsideTheGroupEndsTheWalk) {
  EXPECT_EQ(chain(0, 1, {1, 9}),
            "; rank 1 was itself timed out waiting for rank 9 (the end of the chain of waits)");
}

}  // namespace
}  // namespace shardwise::collectives
