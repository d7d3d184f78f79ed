// Ring all-reduce: reduce-scatter, then all-gather.
//
// The buffer is processed in slabs of at most size * max_segment_bytes. A slab's `slab_count`
// elements are split into `size` chunks whose lengths differ by at most one.
//   Reduce-scatter, step s = 0 .. size-2: rank r sends chunk (r - s) to rank r + 1 and receives
//   chunk (r - s - 1) from rank r - 1, reducing it straight out of the transport into its own
//   copy. After size - 1 steps rank r holds the fully reduced chunk (r + 1).
//   All-gather, step s = 0 .. size-2: rank r sends chunk (r + 1 - s) to rank r + 1 and receives
//   chunk (r - s) from rank r - 1 into place.
// (Chunk indices are mod size.) Every chunk is reduced once, in ring order, then copied, so all
// ranks end bit-identical. Each rank sends and receives 2 (size - 1) / size of the buffer.
#include "collectives/collectives.h"
#include "collectives/reduce.h"

namespace shardwise::collectives::detail {

void ring_reduce_scatter(Transport& transport,
                         char* slab,
                         size_t slab_count,
                         const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  const int right = wrap(rank + 1, size);
  const int left = wrap(rank - 1, size);
  const size_t element = element_size(options.dtype);
  for (int step = 0; step < size - 1; ++step) {  // reduce-scatter
    const Chunk send = chunk_of(slab_count, size, wrap(rank - step, size));
    const Chunk recv = chunk_of(slab_count, size, wrap(rank - step - 1, size));
    char* target = slab + recv.offset * element;
    transport.sendrecv(
        right, {slab + send.offset * element, send.count * element}, left, recv.count * element,
        [&](size_t offset, const void* piece, size_t bytes) {
          reduce_into(target + offset, piece, bytes / element, options.dtype, options.op);
        },
        options.tag, options.deadline);
  }
}

void ring_all_gather(Transport& transport,
                     char* slab,
                     size_t slab_count,
                     const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  const int right = wrap(rank + 1, size);
  const int left = wrap(rank - 1, size);
  const size_t element = element_size(options.dtype);
  for (int step = 0; step < size - 1; ++step) {
    const Chunk send = chunk_of(slab_count, size, wrap(rank + 1 - step, size));
    const Chunk recv = chunk_of(slab_count, size, wrap(rank - step, size));
    transport.sendrecv(right, {slab + send.offset * element, send.count * element}, left,
                       {slab + recv.offset * element, recv.count * element}, options.tag,
                       options.deadline);
  }
}

void allreduce_ring(Transport& transport,
                    void* data,
                    size_t count,
                    const CollectiveOptions& options) {
  const size_t element = element_size(options.dtype);
  const size_t segment_count = std::max<size_t>(1, options.max_segment_bytes / element);
  const size_t slab_capacity = segment_count * static_cast<size_t>(transport.size());
  char* bytes = static_cast<char*>(data);
  for (size_t offset = 0; offset < count; offset += slab_capacity) {
    char* slab = bytes + offset * element;
    const size_t slab_count = std::min(slab_capacity, count - offset);
    ring_reduce_scatter(transport, slab, slab_count, options);
    ring_all_gather(transport, slab, slab_count, options);
  }
}

}  // namespace shardwise::collectives::detail
