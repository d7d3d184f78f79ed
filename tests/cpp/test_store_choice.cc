// StoreChoice (collectives/store_choice.h): small messages never stream; in each size class the
// first exchanges alternate ordinary and streaming stores (a slow cold first sample does not
// decide), the faster wins, the other kind is retried every kExploreEvery-th exchange, and a
// placement change (the other kind becoming faster) takes over within a few retries; where the
// host's ranks outnumber its cores the choice is ordinary stores. Timings here are given, not
// measured.
#include <gtest/gtest.h>

#include "collectives/store_choice.h"

namespace shardwise::collectives {
namespace {

using std::chrono::nanoseconds;

// One exchange of `bytes` at `ordinary` / `streaming` bytes per ns; returns whether it streamed.
bool exchange(StoreChoice& choice, size_t bytes, double ordinary, double streaming) {
  const bool streamed = choice.stream(bytes);
  const double rate = streamed ? streaming : ordinary;
  choice.record(bytes, nanoseconds(static_cast<int64_t>(static_cast<double>(bytes) / rate)));
  return streamed;
}

// Ranks that outnumber the cores share them and their caches: the measured choice becomes
// ordinary stores there, and only there; a kind asked for explicitly is always kept.
TEST(StoreChoice, RanksOutnumberingTheCoresUseOrdinaryStores) {
  using Kind = StoreChoice::Kind;
  EXPECT_EQ(StoreChoice::for_host(Kind::kMeasured, 2, 2), Kind::kMeasured);
  EXPECT_EQ(StoreChoice::for_host(Kind::kMeasured, 1, 2), Kind::kMeasured);
  EXPECT_EQ(StoreChoice::for_host(Kind::kMeasured, 3, 2), Kind::kOrdinary);
  EXPECT_EQ(StoreChoice::for_host(Kind::kMeasured, 8, 2), Kind::kOrdinary);
  for (Kind kind : {Kind::kOrdinary, Kind::kStreaming}) {
    EXPECT_EQ(StoreChoice::for_host(kind, 2, 2), kind);
    EXPECT_EQ(StoreChoice::for_host(kind, 8, 2), kind);
  }
  StoreChoice ordinary(StoreChoice::for_host(Kind::kMeasured, 4, 2));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(exchange(ordinary, 8 << 20, 1.0, 10.0));
}

TEST(StoreChoice, SmallMessagesUseOrdinaryStores) {
  StoreChoice choice;
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(exchange(choice, 65535, 1.0, 10.0));
  EXPECT_EQ(choice.rate(65535, false), 0);
}

TEST(StoreChoice, SizeClassesAreFactorsOfFourFrom64KiB) {
  EXPECT_EQ(StoreChoice::size_class(64 << 10), 0);
  EXPECT_EQ(StoreChoice::size_class((256 << 10) - 1), 0);
  EXPECT_EQ(StoreChoice::size_class(256 << 10), 1);
  EXPECT_EQ(StoreChoice::size_class(1 << 20), 2);
  EXPECT_EQ(StoreChoice::size_class(4 << 20), 3);
  EXPECT_EQ(StoreChoice::size_class(size_t{1} << 40), 3);
}

TEST(StoreChoice, TriesBothThenKeepsTheFasterAndRetriesTheOther) {
  StoreChoice choice;
  const size_t bytes = 8 << 20;
  EXPECT_FALSE(exchange(choice, bytes, 1.0, 5.0));   // first: ordinary, cold (slow)
  EXPECT_TRUE(exchange(choice, bytes, 10.0, 5.0));   // then: streaming
  EXPECT_FALSE(exchange(choice, bytes, 10.0, 5.0));  // ordinary again: this sample counts
  EXPECT_TRUE(exchange(choice, bytes, 10.0, 5.0));
  int streamed = 0;
  for (uint64_t i = 5; i <= 3 * StoreChoice::kExploreEvery; ++i) {
    const bool s = exchange(choice, bytes, 10.0, 5.0);
    EXPECT_EQ(s, i % StoreChoice::kExploreEvery == 0) << i;  // only the retries stream
    streamed += s ? 1 : 0;
  }
  EXPECT_EQ(streamed, 3);
  EXPECT_NEAR(choice.rate(bytes, false), 10.0, 1e-3);  // (whole nanoseconds)
}

TEST(StoreChoice, APlacementChangeIsFollowed) {
  StoreChoice choice;
  const size_t bytes = 1 << 20;
  for (int i = 0; i < 64; ++i) exchange(choice, bytes, 16.0, 8.0);  // caches shared
  EXPECT_GT(choice.rate(bytes, false), choice.rate(bytes, true));
  int before_switch = 0;  // the caches now apart: ordinary stores slow down, streaming wins
  while (!exchange(choice, bytes, 2.0, 9.0)) ASSERT_LT(++before_switch, 8);
  int streamed = 0;
  for (int i = 0; i < 20; ++i) streamed += exchange(choice, bytes, 2.0, 9.0) ? 1 : 0;
  EXPECT_GE(streamed, 19);  // all but at most one retry of ordinary stores
}

TEST(StoreChoice, ClassesAreMeasuredApart) {
  StoreChoice choice;
  for (int i = 0; i < 8; ++i) exchange(choice, 128 << 10, 4.0, 1.0);  // small: ordinary faster
  for (int i = 0; i < 8; ++i) exchange(choice, 8 << 20, 2.0, 9.0);    // large: streaming faster
  EXPECT_FALSE(exchange(choice, 128 << 10, 4.0, 1.0));
  EXPECT_TRUE(exchange(choice, 8 << 20, 2.0, 9.0));
}

}  // namespace
}  // namespace shardwise::collectives
