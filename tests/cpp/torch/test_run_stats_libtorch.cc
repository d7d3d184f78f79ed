// A LibTorch training loop's log (training/run_stats.h's StepLog) and resume report
// (training/run_checkpoint.h's Resumed::report) on 2 thread ranks.
//
// Catches: a log line on the wrong steps or ranks, a loss averaged over ranks that computed none
// (a pipeline's earlier stages), tokens/s over the wrong number of steps, a step time that is not
// the slowest rank's, and a resume report that drops or rewords what shardwise-train prints.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "thread_group.h"
#include "training/run_checkpoint.h"
#include "training/run_stats.h"

namespace {

namespace sw = shardwise;

TEST(RunStatsLibTorch, StepLogPrintsEveryLogEveryStepsAndTheSummaryOnRankZero) {
  std::mutex mutex;
  std::vector<std::vector<std::string>> lines(2);
  std::string summary;
  on_thread_ranks(2, "steplog", [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    sw::training::StepLog log(group, {/*log_every=*/2, /*last_step=*/5, /*tokens_per_step=*/100});
    std::vector<std::string> mine;
    for (int64_t step = 1; step <= 5; ++step) {
      log.begin();
      std::this_thread::sleep_for(std::chrono::milliseconds(rank == 1 ? 30 : 10));
      // Rank 1 computes no loss, as a pipeline's earlier stage.
      const torch::Tensor loss =
          rank == 0 ? torch::tensor(static_cast<double>(step)) : torch::Tensor();
      mine.push_back(log.end(step, loss));
    }
    const std::string last = log.summary();
    std::lock_guard<std::mutex> lock(mutex);
    lines[rank] = mine;
    if (rank == 0) summary = last;
    if (rank == 1) {
      EXPECT_EQ(last, "");
    }
  });
  for (const auto& line : lines[1]) EXPECT_EQ(line, "") << "rank 1 prints nothing";
  ASSERT_EQ(lines[0].size(), 5u);
  for (int i : {0, 2}) EXPECT_EQ(lines[0][i], "") << "step " << i + 1 << " is no log step";
  for (int i : {1, 3, 4}) {
    const int step = i + 1;
    long long printed_step = 0;
    double loss = 0, tokens = 0;
    ASSERT_EQ(std::sscanf(lines[0][i].c_str(), "step %lld loss %lf tokens/s %lf", &printed_step,
                          &loss, &tokens),
              3)
        << lines[0][i];
    EXPECT_EQ(printed_step, step);
    EXPECT_DOUBLE_EQ(loss, step) << "the loss of the one rank that has one";
    // Rank 0's interval holds 2 steps (1 for the last) of at least 10 ms each: 100 tokens per
    // step, so at most 10000 tokens/s; counting 2 steps for the last would give about 20000.
    EXPECT_GT(tokens, 0);
    EXPECT_LE(tokens, 100 / 0.010) << lines[0][i];
  }
  int world = 0;
  double tokens = 0, step_s = 0, rss = 0;
  ASSERT_EQ(
      std::sscanf(summary.c_str(), "summary world %d tokens/s %lf step_s %lf peak_rss_mib %lf",
                  &world, &tokens, &step_s, &rss),
      4)
      << summary;
  EXPECT_EQ(world, 2);
  EXPECT_GE(step_s, 0.030) << "the slowest rank's step time";
  // step_s is printed to 5 decimals: 100 / step_s is known to 100 * 5e-6 / step_s^2.
  EXPECT_NEAR(tokens, 100 / step_s, 0.05 + 100 * 5e-6 / (step_s * step_s));
  EXPECT_GT(rss, 0);
}

TEST(RunStatsLibTorch, StepLogRefusesANonPositiveLogEvery) {
  on_thread_ranks(1, "steplog-bad", [&](int, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    try {
      sw::training::StepLog log(group, {/*log_every=*/0, 5, 100});
      ADD_FAILURE() << "log_every 0 was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("log_every"), std::string::npos) << e.what();
    }
  });
}

TEST(RunStatsLibTorch, ResumeReportSaysWhatShardwiseTrainSays) {
  sw::training::Resumed resumed;
  EXPECT_TRUE(resumed.report().empty()) << "a fresh run reports nothing";
  resumed.step = 3;
  resumed.path = "run/step-3";
  resumed.saved_world = 2;
  resumed.removed = {"run/step-4.tmp"};
  resumed.skipped = {"skipping checkpoint run/step-5: torn"};
  const std::vector<std::string> expected{"removed run/step-4.tmp: a write that never finished",
                                          "warning: skipping checkpoint run/step-5: torn",
                                          "resumed from run/step-3 (step 3, saved by 2 ranks)"};
  EXPECT_EQ(resumed.report(), expected);
}

}  // namespace
