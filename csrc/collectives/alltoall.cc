// All-to-all: rank r copies its own block locally, then in step k = 1 .. size-1 sends its block
// for rank r + k and receives rank r - k's block for it, all pairs of one step at once.
#include <cstring>

#include "collectives/collectives.h"

namespace shardwise::collectives {

void alltoall(Transport& transport,
              const void* input,
              const size_t* send_offsets,
              const size_t* send_bytes,
              void* output,
              const size_t* recv_offsets,
              const size_t* recv_bytes,
              const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  const char* in = static_cast<const char*>(input);
  char* out = static_cast<char*>(output);
  if (send_bytes[rank] > 0) {
    std::memmove(out + recv_offsets[rank], in + send_offsets[rank], send_bytes[rank]);
  }
  for (int step = 1; step < size; ++step) {
    const int to = detail::wrap(rank + step, size);
    const int from = detail::wrap(rank - step, size);
    transport.sendrecv(to, {in + send_offsets[to], send_bytes[to]}, from,
                       {out + recv_offsets[from], recv_bytes[from]}, options.tag, options.deadline);
  }
}

}  // namespace shardwise::collectives
