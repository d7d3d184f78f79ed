// Ring reduce-scatter on rank-major input: block b of `input` is the part rank b ends up owning.
//
// In segments of at most max_segment_bytes per block, a running `partial` sum travels around the
// ring. Step 0: rank r sends its own block (r - 1) to rank r + 1. Step s = 0 .. size-2: rank r
// receives the partial of block (r - s - 2) from rank r - 1 and, straight out of the transport,
// adds its own input of that block into `next`; `next` is what it sends at step s + 1. After
// size - 1 steps the received block is r, summed over every rank: averaged (AVG) and narrowed
// into `output`. Only two segment-sized buffers are needed, in the accumulation type (float32 for
// 16-bit floats), whatever the input size.
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/reduce.h"

namespace shardwise::collectives {

void reduce_scatter(Transport& transport,
                    const void* input,
                    void* output,
                    size_t count,
                    const CollectiveOptions& options) {
  check_reduce(options.dtype, options.op);
  const int size = transport.size();
  const int rank = transport.rank();
  const Datatype dtype = options.dtype;
  const size_t in_element = element_size(dtype);
  if (count == 0) return;
  if (size == 1) {  // a group of one: the reduction is the input (AVG divides by 1)
    std::memcpy(output, input, count * in_element);
    return;
  }
  const Datatype wide = accumulation_type(dtype);
  const size_t element = element_size(wide);
  const char* in = static_cast<const char*>(input);
  const size_t segment = std::max<size_t>(1, options.max_segment_bytes / element);
  std::vector<char> partial(std::min(segment, count) * element);
  std::vector<char> next(partial.size());
  for (size_t first = 0; first < count; first += segment) {
    const size_t n = std::min(segment, count - first);
    auto block = [&](int b) { return in + (static_cast<size_t>(b) * count + first) * in_element; };
    widen(block(detail::wrap(rank - 1, size)), partial.data(), n, dtype);
    for (int step = 0; step < size - 1; ++step) {
      const char* own = block(detail::wrap(rank - step - 2, size));
      transport.sendrecv(
          detail::wrap(rank + 1, size), {partial.data(), n * element}, detail::wrap(rank - 1, size),
          n * element,
          [&](size_t offset, const void* piece, size_t bytes) {
            const size_t k = bytes / element;
            char* target = next.data() + offset;
            widen(own + offset / element * in_element, target, k, dtype);
            reduce_into(target, piece, k, wide, options.op);
          },
          options.tag, options.deadline);
      partial.swap(next);
    }
    // `partial` now holds this segment of block `rank`, reduced over every rank.
    if (options.op == ReduceOp::kAvg) finish_average(partial.data(), n, wide, size);
    char* out = static_cast<char*>(output) + first * in_element;
    narrow(partial.data(), out, n, dtype);
  }
}

}  // namespace shardwise::collectives
