// Direct all-reduce for small messages: in step k = 1 .. size-1, rank r sends its whole input to
// rank r + k and receives rank r - k's input into slot (r - k) of `gathered`; then every rank
// reduces the slots in rank order 0, 1, .., size-1, so all ranks compute the same sums in the
// same order (bit-identical) after one round of latency instead of the ring's 2 (size - 1).
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/reduce.h"

namespace shardwise::collectives::detail {

void allreduce_direct(Transport& transport,
                      void* data,
                      size_t count,
                      const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  const size_t bytes = count * element_size(options.dtype);
  std::vector<char> gathered(bytes * size);
  std::memcpy(gathered.data() + bytes * rank, data, bytes);
  for (int step = 1; step < size; ++step) {
    const int source = wrap(rank - step, size);
    transport.sendrecv(wrap(rank + step, size), {data, bytes}, source,
                       {gathered.data() + bytes * source, bytes}, options.tag, options.deadline);
  }
  std::memcpy(data, gathered.data(), bytes);
  for (int source = 1; source < size; ++source) {
    reduce_into(data, gathered.data() + bytes * source, count, options.dtype, options.op);
  }
}

}  // namespace shardwise::collectives::detail
