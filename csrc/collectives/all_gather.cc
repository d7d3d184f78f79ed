// Ring all-gather: rank r's input goes to block r of everyone's output. In segments of at most
// max_segment_bytes, step s = 0 .. size-2: rank r sends block (r - s) to rank r + 1 and receives
// block (r - s - 1) from rank r - 1 into place, so every block travels once around the ring.
#include <cstring>

#include "collectives/collectives.h"

namespace shardwise::collectives {

void all_gather(Transport& transport,
                const void* input,
                void* output,
                size_t count,
                const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  const size_t bytes = count * element_size(options.dtype);
  char* out = static_cast<char*>(output);
  if (out + rank * bytes != input && bytes > 0) std::memmove(out + rank * bytes, input, bytes);
  const size_t segment = std::max<size_t>(1, options.max_segment_bytes);
  for (size_t first = 0; first < bytes && size > 1; first += segment) {
    const size_t n = std::min(segment, bytes - first);
    for (int step = 0; step < size - 1; ++step) {
      const size_t send_block = detail::wrap(rank - step, size);
      const size_t recv_block = detail::wrap(rank - step - 1, size);
      transport.sendrecv(detail::wrap(rank + 1, size), {out + send_block * bytes + first, n},
                         detail::wrap(rank - 1, size), {out + recv_block * bytes + first, n},
                         options.tag, options.deadline);
    }
  }
}

}  // namespace shardwise::collectives
