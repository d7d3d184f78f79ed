// Chain broadcast: ranks form a chain starting at the root (position = (rank - root) mod size).
// For each segment of at most max_segment_bytes, every rank but the root receives it from its
// predecessor and every rank but the last forwards it to its successor; segments pipeline down
// the chain because each rank forwards a segment while its predecessor sends the next one.
#include <stdexcept>
#include <string>

#include "collectives/collectives.h"

namespace shardwise::collectives {

void broadcast(
    Transport& transport, void* data, size_t bytes, int root, const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  if (root < 0 || root >= size) {
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " is outside [0, " +
                                std::to_string(size) + ")");
  }
  if (size == 1) return;
  const int position = detail::wrap(rank - root, size);
  const int previous = position == 0 ? -1 : detail::wrap(rank - 1, size);
  const int next = position == size - 1 ? -1 : detail::wrap(rank + 1, size);
  char* buffer = static_cast<char*>(data);
  const size_t segment = std::max<size_t>(1, options.max_segment_bytes);
  size_t first = 0;
  do {  // at least once, so empty broadcasts still synchronise the tags
    const size_t n = std::min(segment, bytes - first);
    if (previous >= 0) {
      transport.sendrecv(-1, {}, previous, {buffer + first, n}, options.tag, options.deadline);
    }
    if (next >= 0) {
      transport.sendrecv(next, {buffer + first, n}, -1, Buffer{}, options.tag, options.deadline);
    }
    first += n;
  } while (first < bytes);
}

}  // namespace shardwise::collectives
