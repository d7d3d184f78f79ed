// monitored_barrier, as gloo's: every rank but 0 reports its arrival and waits to be released;
// rank 0 waits for each in rank order until `deadline`, then releases them all. A rank that did
// not arrive is named (every one of them with wait_all_ranks), so a hung or dead rank is found
// by name instead of by a timeout somewhere else. The arrivals go through the group's store,
// not the transport: a failed barrier leaves the transport's message order as it was.
#include <c10/util/Exception.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "backend/shardwise_backend.hpp"

namespace shardwise::backend {

namespace {

using std::chrono::milliseconds;

std::string joined(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

// Waits for `key` in `store` for up to `timeout` (at least 1 ms: 0 means "forever" to stores).
bool arrives(c10d::Store& store, const std::string& key, milliseconds timeout) {
  try {
    store.wait({key}, std::max(timeout, milliseconds(1)));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

void ShardwiseBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const milliseconds timeout = timeout_or_default(opts.timeout);
  const std::string key = "shardwise/monitored_barrier/" + std::to_string(monitored_barriers_++);
  auto arrived = [&key](int rank) { return key + "/arrived/" + std::to_string(rank); };
  if (rank_ != 0) {
    store_->set(arrived(rank_), std::vector<uint8_t>{1});
    TORCH_CHECK(arrives(*store_, key + "/release", timeout), "Rank ", rank_,
                " successfully reached monitoredBarrier, but received errors while waiting for "
                "send/recv from rank 0. Please check rank 0 logs for faulty rank.");
    return;
  }
  TORCH_CHECK(timeout.count() > 0, "Rank 0 timed out in monitoredBarrier after ", timeout.count(),
              " ms.");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> failed, processed;
  for (int r = 1; r < size_; ++r) {
    const auto remaining =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    TORCH_CHECK(wait_all_ranks || remaining.count() > 0,
                "Rank 0 timed out in monitoredBarrier after ", timeout.count(),
                " ms. Successfully processed ranks: ", joined(processed));
    if (arrives(*store_, arrived(r), remaining)) {
      processed.push_back(r);
      continue;
    }
    TORCH_CHECK(wait_all_ranks, "[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ",
                timeout.count(), " ms");
    failed.push_back(r);
  }
  TORCH_CHECK(failed.empty(), "[Rank 0]: Ranks ", joined(failed),
              " failed to pass monitoredBarrier in ", timeout.count(), " ms");
  store_->set(key + "/release", std::vector<uint8_t>{1});
}

}  // namespace shardwise::backend
