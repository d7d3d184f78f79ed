// Receive from any source: polls every peer with Transport::message_waiting until one has a
// message (the first found in `peers` order wins), spinning briefly, then sleeping `pause`,
// doubled up to 1 ms, between sweeps; gives up at `deadline` naming the peers waited for.
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.h"

namespace shardwise::collectives {

int wait_for_any(Transport& transport, const std::vector<int>& peers, Clock::time_point deadline) {
  if (peers.empty()) throw std::invalid_argument("wait_for_any: no peers to wait for");
  constexpr int kSpinSweeps = 64;
  auto pause = std::chrono::microseconds(20);
  for (int sweep = 0;; ++sweep) {
    for (int peer : peers) {
      if (transport.message_waiting(peer)) return peer;
    }
    if (Clock::now() >= deadline) {
      std::string names;
      for (int peer : peers) names += (names.empty() ? "" : ", ") + std::to_string(peer);
      throw TransportError("rank " + std::to_string(transport.rank()) +
                           ": Timed out waiting for a message from any of ranks " + names +
                           " (receive from any source)");
    }
    if (sweep >= kSpinSweeps) {
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
  }
}

}  // namespace shardwise::collectives
