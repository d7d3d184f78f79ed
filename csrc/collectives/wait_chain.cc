// Follows the chain of waits from `peer` (see wait_chain.h). `seen` holds the ranks passed, so a
// cycle ends the walk; a rank outside [0, size) ends it too, since it cannot be looked up.
#include "collectives/wait_chain.h"

#include <algorithm>
#include <vector>

namespace shardwise::collectives {

std::string describe_wait_chain(int self,
                                int peer,
                                int size,
                                const std::function<int(int)>& waiting_for,
                                const std::function<std::string(int)>& name) {
  std::string text;
  std::vector<int> seen{self, peer};
  int at = peer;
  while (at >= 0 && at < size) {
    const int next = waiting_for(at);
    if (next < 0) break;
    text += text.empty() ? "; " + name(at) + " was itself timed out waiting for " + name(next)
                         : ", " + name(at) + " for " + name(next);
    if (std::find(seen.begin(), seen.end(), next) != seen.end()) {
      return text + ": a cycle of waits (did the ranks call collectives in different orders?)";
    }
    seen.push_back(next);
    at = next;
  }
  return text.empty() ? text : text + " (the end of the chain of waits)";
}

}  // namespace shardwise::collectives
