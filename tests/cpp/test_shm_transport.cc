// Shared-memory transport specifics: the segment's name is gone once set-up ends (nothing can
// leak into /dev/shm, even on a crash), a rank started with another world size is rejected, and
// a peer process that dies mid-collective is reported within milliseconds, not at the deadline.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
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

}  // namespace
}  // namespace shardwise::collectives
