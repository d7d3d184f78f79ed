// Dissemination barrier: in round d = 1, 2, 4, .. < size, rank r sends an empty message to
// rank r + d and waits for one from rank r - d. After ceil(log2 size) rounds every rank has
// (transitively) heard from every other, so none leaves before all have entered. Point-to-point
// send and recv are here too: one message each.
#include "collectives/collectives.h"

namespace shardwise::collectives {

void barrier(Transport& transport, const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  for (int distance = 1; distance < size; distance *= 2) {
    transport.sendrecv(detail::wrap(rank + distance, size), {}, detail::wrap(rank - distance, size),
                       Buffer{}, options.tag, options.deadline);
  }
}

void send(Transport& transport,
          int peer,
          const void* data,
          size_t bytes,
          const CollectiveOptions& options) {
  transport.sendrecv(peer, {data, bytes}, -1, Buffer{}, options.tag, options.deadline);
}

void recv(
    Transport& transport, int peer, void* data, size_t bytes, const CollectiveOptions& options) {
  transport.sendrecv(-1, {}, peer, {data, bytes}, options.tag, options.deadline);
}

}  // namespace shardwise::collectives
