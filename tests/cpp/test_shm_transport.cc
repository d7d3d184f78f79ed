// Shared-memory transport specifics: the segment's name is gone once set-up ends (nothing can
// leak into /dev/shm, even on a crash), a rank started with another world size is rejected, and
// a peer process that dies mid-collective (even inside an exchange) is reported within
// milliseconds, not at the deadline.
// A timeout names the rank truly at fault: ranks by their number in the enclosing group, the
// failure a peer reports during the grace period, or else the chain of ranks that timed out.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "collectives_harness.h"

namespace shardwise::collectives {
namespace {

using testing::error_text;

ShmTransportOptions options_for(const std::string& name, int rank, int size) {
  ShmTransportOptions options;
  options.name = name;
  options.rank = rank;
  options.size = size;
  options.ring_bytes = 4096;
  options.connect_timeout = std::chrono::seconds(10);
  return options;
}

TEST(ShmTransport, NameIsUnlinkedOnceEveryRankHasAttached) {
  const std::string name = testing::unique_shm_name();
  std::exception_ptr error;
  std::thread other([&] {
    try {
      ShmTransport peer(options_for(name, 1, 2));
    } catch (...) {
      error = std::current_exception();
    }
  });
  {
    ShmTransport root(options_for(name, 0, 2));
    other.join();
    EXPECT_EQ(::shm_open(name.c_str(), O_RDWR, 0600), -1);
    EXPECT_EQ(errno, ENOENT);
  }
  EXPECT_EQ(error_text(error), "");
}

// A larger world size expects a larger segment: the peer once waited its whole connect timeout
// (10 s here) for a segment of its own size, then said only that it "did not appear".
TEST(ShmTransport, RanksStartedWithAnotherWorldSizeAreRejected) {
  const std::string name = testing::unique_shm_name();
  std::exception_ptr error;
  Clock::duration peer_waited{};
  std::thread other([&] {
    const auto start = Clock::now();
    try {
      ShmTransport peer(options_for(name, 1, 3));  // rank 0 says 2
    } catch (...) {
      error = std::current_exception();
    }
    peer_waited = Clock::now() - start;
  });
  auto root_options = options_for(name, 0, 2);
  root_options.connect_timeout = std::chrono::seconds(2);
  EXPECT_THROW(ShmTransport root(root_options), TransportError);
  other.join();
  EXPECT_EQ(error_text(error),
            "rank 1 joined with world size 3 and ring_bytes 4096, but rank 0 created the group "
            "with 2 and 4096; start every rank alike");
  EXPECT_LT(peer_waited, std::chrono::seconds(5));
  EXPECT_EQ(::shm_open(name.c_str(), O_RDWR, 0600), -1);  // rank 0 cleaned up on failure
}

TEST(ShmTransport, APeerProcessThatDiesIsReportedQuickly) {
  const std::string name = testing::unique_shm_name();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: attach, then die without taking part
    try {
      ShmTransport peer(options_for(name, 1, 2));
    } catch (...) {
    }
    ::_exit(0);
  }
  std::string text;
  const auto start = Clock::now();
  try {
    ShmTransport root(options_for(name, 0, 2));
    ::waitpid(child, nullptr, 0);  // reaped: gone for good
    std::vector<float> data(10000, 1.0f);
    CollectiveOptions options;
    options.deadline = Clock::now() + std::chrono::seconds(60);
    allreduce(root, data.data(), data.size(), options);
  } catch (const std::exception& e) {
    text = e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(text.find("peer rank 1 (pid " + std::to_string(child) + ") exited"), std::string::npos)
      << text;
}

// A peer killed inside an exchange (half of its all-reduce written into the ring, waiting for
// the rest) is named within the same seconds as a peer that died outside any exchange.
TEST(ShmTransport, APeerKilledInsideAnExchangeIsReportedQuickly) {
  const std::string name = testing::unique_shm_name();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1: attach, enter an all-reduce rank 0 has not joined yet, be killed
    try {
      ShmTransport peer(options_for(name, 1, 2));
      std::vector<float> data(10000, 1.0f);
      CollectiveOptions options;
      options.deadline = Clock::now() + std::chrono::seconds(60);
      allreduce(peer, data.data(), data.size(), options);
    } catch (...) {
    }
    ::_exit(0);
  }
  std::string text;
  Clock::duration reported_after{};
  try {
    ShmTransport root(options_for(name, 0, 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 waits in its exchange
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    std::vector<float> data(10000, 1.0f);
    CollectiveOptions options;
    options.deadline = Clock::now() + std::chrono::seconds(60);
    const auto start = Clock::now();
    try {
      allreduce(root, data.data(), data.size(), options);
    } catch (...) {
      reported_after = Clock::now() - start;
      throw;
    }
  } catch (const std::exception& e) {
    text = e.what();
  }
  EXPECT_LT(reported_after, std::chrono::seconds(10));
  EXPECT_NE(text.find("peer rank 1 (pid " + std::to_string(child) + ") exited"), std::string::npos)
      << text;
}

// Each way of writing large messages into the ring (store_choice.h: measured, always ordinary,
// always streaming) carries an all-reduce and an all-gather exactly, over a ring smaller than
// the messages (so streamed pieces wrap it) and at sizes from below the streaming threshold up.
TEST(ShmTransport, EveryRingStoreKindIsExact) {
  using Kind = StoreChoice::Kind;
  for (Kind kind : {Kind::kMeasured, Kind::kOrdinary, Kind::kStreaming}) {
    const std::string name = testing::unique_shm_name();
    std::vector<std::exception_ptr> errors(2);
    std::vector<std::vector<float>> reduced(2), gathered(2);
    auto run = [&](int rank) {
      try {
        auto options = options_for(name, rank, 2);
        options.ring_bytes = 64 << 10;
        options.stores = kind;
        ShmTransport transport(options);
        CollectiveOptions collective;
        collective.deadline = Clock::now() + std::chrono::seconds(60);
        for (size_t count : {size_t{1000}, size_t{70001}, size_t{300000}}) {
          std::vector<float> data(count), all(2 * count);
          for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(i % 1000 + rank);
          all_gather(transport, data.data(), all.data(), count, collective);
          allreduce(transport, data.data(), count, collective);
          reduced[rank].insert(reduced[rank].end(), data.begin(), data.end());
          gathered[rank].insert(gathered[rank].end(), all.begin(), all.end());
        }
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    };
    std::thread other(run, 1);
    run(0);
    other.join();
    for (int rank = 0; rank < 2; ++rank) ASSERT_EQ(error_text(errors[rank]), "") << rank;
    size_t at = 0, gathered_at = 0;
    for (size_t count : {size_t{1000}, size_t{70001}, size_t{300000}}) {
      for (size_t i = 0; i < count; ++i, ++at) {
        const float expected = static_cast<float>(2 * (i % 1000) + 1);
        ASSERT_EQ(reduced[0][at], expected) << static_cast<int>(kind) << " " << count << " " << i;
        ASSERT_EQ(reduced[1][at], expected);
      }
      for (int source = 0; source < 2; ++source) {
        for (size_t i = 0; i < count; ++i, ++gathered_at) {
          const float expected = static_cast<float>(i % 1000 + source);
          ASSERT_EQ(gathered[0][gathered_at], expected);
          ASSERT_EQ(gathered[1][gathered_at], expected);
        }
      }
    }
  }
}

// Whether this process can read `pid`'s copy of a static token (fork keeps its address): the
// same permission the transport's set-up probe needs, checked without the transport.
bool can_read_memory_of(pid_t pid) {
  static const uint64_t kToken = 0x5348415244574953ull;
  uint64_t got = 0;
  iovec local{&got, sizeof(got)};
  iovec remote{const_cast<uint64_t*>(&kToken), sizeof(got)};
  return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof(got) && got == kToken;
}

// Two processes with single-copy messages on: the set-up probe turns single copy on exactly when
// each process can read the other's memory, and collectives whose messages then go by
// process_vm_readv (larger than the ring, so the ring would otherwise wrap many times) give exact
// results on both sides.
// The measured store choice is made only where each rank has a core: with more ranks than the
// host's CPUs (ShmTransportOptions::cores, here given) every rank writes with ordinary stores
// (store_choice.h says why); with as many ranks as CPUs it measures. Catches a transport that
// ignores the host's cores.
TEST(ShmTransport, RanksOutnumberingTheCoresWriteWithOrdinaryStores) {
  using Kind = StoreChoice::Kind;
  const int size = 3;
  for (long cores : {3L, 2L}) {
    const std::string name = testing::unique_shm_name();
    std::vector<std::exception_ptr> errors(size);
    std::vector<Kind> kinds(size, Kind::kStreaming);
    auto run = [&](int rank) {
      try {
        auto options = options_for(name, rank, size);
        options.cores = cores;
        ShmTransport transport(options);
        kinds[rank] = transport.stores();
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    };
    std::vector<std::thread> others;
    for (int rank = 1; rank < size; ++rank) others.emplace_back(run, rank);
    run(0);
    for (auto& other : others) other.join();
    const Kind expected = size > cores ? Kind::kOrdinary : Kind::kMeasured;
    for (int rank = 0; rank < size; ++rank) {
      ASSERT_EQ(error_text(errors[rank]), "") << rank;
      EXPECT_EQ(kinds[rank], expected) << "rank " << rank << " of " << size << ", " << cores;
    }
  }
}

TEST(ShmTransport, SingleCopyBetweenProcessesIsExact) {
  const std::string name = testing::unique_shm_name();
  const size_t count = 300000;  // 1.2 MB per rank against a 4 KiB ring
  auto run = [&](int rank) {
    auto options = options_for(name, rank, 2);
    options.single_copy_bytes = 4096;
    ShmTransport transport(options);
    std::vector<float> data(count), gathered(2 * count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(i % 1000 + rank);
    CollectiveOptions collective;
    collective.deadline = Clock::now() + std::chrono::seconds(60);
    all_gather(transport, data.data(), gathered.data(), count, collective);
    allreduce(transport, data.data(), count, collective);
    bool exact = true;
    for (size_t i = 0; i < count; ++i) {
      exact = exact && data[i] == static_cast<float>(2 * (i % 1000) + 1) &&
              gathered[i] == static_cast<float>(i % 1000) &&
              gathered[count + i] == static_cast<float>(i % 1000 + 1);
    }
    return std::make_pair(transport.single_copy(), exact);
  };
  // Rank 1's exit status: bit 0 wrong results, bit 1 an exception, bit 2 single copy on, bit 3
  // it could read rank 0's memory. Each side checks readability before the collectives, while
  // the other is certainly alive (it cannot finish without this side).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = can_read_memory_of(::getppid()) ? 8 : 0;
    try {
      const auto [single_copy, exact] = run(1);
      status |= (exact ? 0 : 1) | (single_copy ? 4 : 0);
    } catch (...) {
      status |= 2;
    }
    ::_exit(status);
  }
  const bool parent_reads_child = can_read_memory_of(child);
  const auto [single_copy, exact] = run(0);
  int status = -1;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "rank 1's status: " << status;
  const int bits = WEXITSTATUS(status);
  EXPECT_TRUE(exact);
  EXPECT_EQ(bits & 3, 0) << "rank 1: wrong results (1) or an exception (2): " << bits;
  const bool both_read = parent_reads_child && (bits & 8) != 0;
  EXPECT_EQ(single_copy, both_read);
  EXPECT_EQ((bits & 4) != 0, both_read);
}

// Runs `world` ranks of one segment as threads; `body(rank, transport)` is each rank's part.
// Returns each rank's error text ("" for none).
std::vector<std::string> run_shm_ranks(int world,
                                       const std::function<void(ShmTransportOptions&)>& tweak,
                                       const std::function<void(int, ShmTransport&)>& body) {
  const std::string name = testing::unique_shm_name();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto options = options_for(name, rank, world);
        tweak(options);
        ShmTransport transport(options);
        body(rank, transport);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<std::string> texts;
  for (const auto& error : errors) texts.push_back(error_text(error));
  return texts;
}

void receive_one_float(ShmTransport& transport, int from, std::chrono::milliseconds within) {
  float got = 0;
  transport.sendrecv(-1, ConstBuffer{}, from, Buffer{&got, sizeof(got)},
                     make_tag(Kind::kAllreduce, 7), Clock::now() + within);
}

// A hybrid transport's shared memory holds its host's ranks renumbered from 0: without
// group_ranks, global rank 3 reported "rank 1: Timed out waiting for rank 0".
TEST(ShmTransport, ErrorsNameRanksByTheirNumberInTheGroup) {
  std::atomic<bool> done{false};
  const auto texts = run_shm_ranks(
      2,
      [](ShmTransportOptions& options) {
        options.group_ranks = {2, 3};
        options.abort_grace = std::chrono::milliseconds(10);
      },
      [&](int rank, ShmTransport& transport) {
        if (rank == 0) {  // stays in the group, sends nothing
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          return;
        }
        try {
          receive_one_float(transport, 0, std::chrono::milliseconds(100));
        } catch (...) {
          done = true;
          throw;
        }
        done = true;
      });
  EXPECT_EQ(texts[0], "");
  EXPECT_EQ(texts[1].rfind("rank 3: Timed out waiting for rank 2 in all_reduce #7", 0), 0u)
      << texts[1];
}

// Rank 0 waits for rank 1, which is blocked on a rank beyond this segment and fails 300 ms after
// rank 0's deadline: rank 0's error carries rank 1's notice (naming rank 7), and it comes as soon
// as the notice does, not at the end of the grace period.
TEST(ShmTransport, ATimeoutCarriesTheFailureAPeerReportsDuringTheGrace) {
  Clock::duration rank0_waited{};
  const auto texts = run_shm_ranks(
      2, [](ShmTransportOptions& options) { options.abort_grace = std::chrono::seconds(20); },
      [&](int rank, ShmTransport& transport) {
        const auto start = Clock::now();
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(400));
          transport.abort("rank 1: Timed out waiting for rank 7 across the network");
          return;
        }
        try {
          receive_one_float(transport, 1, std::chrono::milliseconds(100));
        } catch (...) {
          rank0_waited = Clock::now() - start;
          throw;
        }
      });
  EXPECT_EQ(texts[0].rfind("rank 0: Timed out waiting for rank 1 in all_reduce #7", 0), 0u)
      << texts[0];
  EXPECT_NE(texts[0].find("; meanwhile the group failed: rank 1 aborted: rank 1: Timed out "
                          "waiting for rank 7 across the network"),
            std::string::npos)
      << texts[0];
  EXPECT_LT(rank0_waited, std::chrono::seconds(10));
}

// abort() once published failed_rank before writing the text, so a peer polling at that moment
// reported "group failed in …: " with no reason (seen under TSan in CI). Many short rounds give
// the peer many chances to look in between.
TEST(ShmTransport, APeerThatSeesTheFailureReadsItsWholeReason) {
  const std::string reason(200, 'x');
  for (int round = 0; round < 200; ++round) {
    const auto texts = run_shm_ranks(
        2, [](ShmTransportOptions&) {},
        [&](int rank, ShmTransport& transport) {
          if (rank == 1) {
            transport.abort(reason);
            return;
          }
          receive_one_float(transport, 1, std::chrono::seconds(30));
        });
    ASSERT_NE(texts[0].find("rank 1 aborted: " + reason), std::string::npos)
        << "round " << round << ": " << texts[0];
  }
}

// Rank 0 waits for rank 1, rank 1 for rank 2, and rank 2 for nobody (a stalled rank): with no
// notice, rank 0's error follows the chain to rank 2. Ranks 0 and 1 waiting for each other is a
// cycle, and is called one.
TEST(ShmTransport, WithoutANoticeATimeoutFollowsTheChainOfWaits) {
  const auto tweak = [](ShmTransportOptions& options) {
    options.abort_grace = std::chrono::milliseconds(1000);
  };
  std::atomic<int> finished{0};
  const auto chain = run_shm_ranks(3, tweak, [&](int rank, ShmTransport& transport) {
    if (rank == 2) {
      while (finished.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    try {
      receive_one_float(transport, rank + 1, std::chrono::milliseconds(200));
    } catch (...) {
      ++finished;
      throw;
    }
    ++finished;
  });
  EXPECT_EQ(chain[0],
            "rank 0: Timed out waiting for rank 1 in all_reduce #7 (4 bytes); rank 1 was itself "
            "timed out waiting for rank 2 (the end of the chain of waits)");
  EXPECT_EQ(chain[1], "rank 1: Timed out waiting for rank 2 in all_reduce #7 (4 bytes)");
  EXPECT_EQ(chain[2], "");
  const auto cycle = run_shm_ranks(2, tweak, [](int rank, ShmTransport& transport) {
    receive_one_float(transport, 1 - rank, std::chrono::milliseconds(200));
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(cycle[rank].find("; rank " + std::to_string(1 - rank) +
                               " was itself timed out waiting for rank " + std::to_string(rank) +
                               ": a cycle of waits"),
              std::string::npos)
        << cycle[rank];
  }
}

}  // namespace
}  // namespace shardwise::collectives
