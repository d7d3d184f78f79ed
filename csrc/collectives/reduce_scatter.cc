// Ring reduce-scatter: block b (at blocks[b]; rank-major `input` for reduce_scatter) is the part
// rank b ends up owning.
//
// In segments of at most max_segment_bytes per block, a running `partial` sum travels around the
// ring. Step 0: rank r sends its own block (r - 1) to rank r + 1. Step s = 0 .. size-2: rank r
// receives the partial of block (r - s - 2) from rank r - 1 and, straight out of the transport,
// adds its own input of that block into `next`; `next` is what it sends at step s + 1. After
// size - 1 steps the received block is r, summed over every rank: averaged (AVG) and narrowed
// into `output`. Only two segment-sized buffers are needed, in the accumulation type (float32 for
// 16-bit floats), whatever the input size. Types reduced as they are (no widening) skip them at
// both ends: step 0 sends straight from `input`, and the last step sums into `output`.
#include <cstring>
#include <memory>
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
  const size_t in_element = element_size(options.dtype);
  if (count == 0) return;
  if (size == 1) {  // a group of one: the reduction is the input (AVG divides by 1)
    std::memcpy(output, input, count * in_element);
    return;
  }
  const auto hosts = options.hierarchical ? detail::host_layout(transport) : std::nullopt;
  if (hosts) {
    detail::reduce_scatter_hierarchical(transport, *hosts, input, output, count, options);
    return;
  }
  std::vector<const char*> blocks(static_cast<size_t>(size));
  for (int b = 0; b < size; ++b) {
    blocks[b] = static_cast<const char*>(input) + static_cast<size_t>(b) * count * in_element;
  }
  detail::reduce_scatter_blocks(transport, blocks, output, count, options);
}

void detail::reduce_scatter_blocks(Transport& transport,
                                   const std::vector<const char*>& blocks,
                                   void* output,
                                   size_t count,
                                   const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  const Datatype dtype = options.dtype;
  const size_t in_element = element_size(dtype);
  const Datatype wide = accumulation_type(dtype);
  const size_t element = element_size(wide);
  const bool widened = wide != dtype;
  if (count == 0) return;
  if (size == 1) {
    std::memcpy(output, blocks[0], count * in_element);
    return;
  }
  const size_t segment = std::max<size_t>(1, options.max_segment_bytes / element);
  const size_t buffer_bytes = std::min(segment, count) * element;
  std::unique_ptr<char[]> partial(new char[buffer_bytes]);  // left uninitialised: always written
  std::unique_ptr<char[]> next(new char[buffer_bytes]);
  for (size_t first = 0; first < count; first += segment) {
    const size_t n = std::min(segment, count - first);
    auto block = [&](int b) { return blocks[static_cast<size_t>(b)] + first * in_element; };
    // What step 0 sends: this rank's block (r - 1), straight from `input` unless it needs widening.
    const char* send = block(detail::wrap(rank - 1, size));
    if (widened) {
      widen(send, partial.get(), n, dtype);
      send = partial.get();
    }
    char* out = static_cast<char*>(output) + first * in_element;
    for (int step = 0; step < size - 1; ++step) {
      const char* own = block(detail::wrap(rank - step - 2, size));
      // The last step's sum is this rank's result: written straight into `output` when no
      // narrowing follows.
      const bool last = step == size - 2;
      char* target_base = last && !widened ? out : next.get();
      transport.sendrecv(
          detail::wrap(rank + 1, size), {send, n * element}, detail::wrap(rank - 1, size),
          n * element,
          [&](size_t offset, const void* piece, size_t bytes) {
            const size_t k = bytes / element;
            char* target = target_base + offset;
            if (widened) {
              widen(own + offset / element * in_element, target, k, dtype);
              reduce_into(target, piece, k, wide, options.op);
            } else {
              reduce_from(target, own + offset, piece, k, wide, options.op);
            }
          },
          options.tag, options.deadline);
      partial.swap(next);
      send = partial.get();
    }
    // `send` now holds this segment of block `rank`, reduced over every rank (in `out` already
    // when no narrowing was needed).
    if (widened) {
      if (options.op == ReduceOp::kAvg) finish_average(partial.get(), n, wide, size);
      narrow(partial.get(), out, n, dtype);
    } else if (options.op == ReduceOp::kAvg) {
      finish_average(out, n, wide, size);
    }
  }
}

}  // namespace shardwise::collectives
