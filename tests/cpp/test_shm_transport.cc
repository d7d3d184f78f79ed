// Shared-memory transport specifics: the segment's name is gone once set-up ends (nothing can
// leak into /dev/shm, even on a crash), a rank started with another world size is rejected, and
// a peer process that dies mid-collective is reported within milliseconds, not at the deadline.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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

TEST(ShmTransport, RanksStartedWithAnotherWorldSizeAreRejected) {
  const std::string name = testing::unique_shm_name();
  std::exception_ptr error;
  std::thread other([&] {
    try {
      ShmTransport peer(options_for(name, 1, 3));  // rank 0 says 2
    } catch (...) {
      error = std::current_exception();
    }
  });
  auto root_options = options_for(name, 0, 2);
  root_options.connect_timeout = std::chrono::seconds(2);
  EXPECT_THROW(ShmTransport root(root_options), TransportError);
  other.join();
  const std::string text = error_text(error);
  EXPECT_TRUE(text.find("world size 3") != std::string::npos ||
              text.find("did not appear") != std::string::npos)
      << text;
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

}  // namespace
}  // namespace shardwise::collectives
