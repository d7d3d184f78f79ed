// Ring all-gather: rank r's input goes to block r of everyone's output (at blocks[r] for
// all_gather_blocks, rank-major in `output` for all_gather). In segments of at most
// max_segment_bytes, step s = 0 .. size-2: rank r sends block (r - s) to rank r + 1 and receives
// block (r - s - 1) from rank r - 1 into place, so every block travels once around the ring.
// Step 0 sends the segment of this rank's own block straight from `input`, right after copying it
// into `output` (so it is read from memory once). Outputs of streaming_bytes or more are written
// with streaming stores.
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "common/stream_copy.h"

namespace shardwise::collectives {

void all_gather(Transport& transport,
                const void* input,
                void* output,
                size_t count,
                const CollectiveOptions& options) {
  const int size = transport.size();
  const auto hosts = options.hierarchical ? detail::host_layout(transport) : std::nullopt;
  if (hosts) {
    detail::all_gather_hierarchical(transport, *hosts, input, output, count, options);
    return;
  }
  const size_t bytes = count * element_size(options.dtype);
  const bool streaming = bytes * size >= options.streaming_bytes;
  std::vector<char*> blocks(static_cast<size_t>(size));
  for (int b = 0; b < size; ++b) blocks[b] = static_cast<char*>(output) + b * bytes;
  detail::all_gather_blocks(transport, input, blocks, count, streaming, options);
}

void detail::all_gather_blocks(Transport& transport,
                               const void* input,
                               const std::vector<char*>& blocks,
                               size_t count,
                               bool streaming,
                               const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  const size_t bytes = count * element_size(options.dtype);
  const char* in = static_cast<const char*>(input);
  auto copy = [streaming](char* to, const char* from, size_t n) {
    streaming ? stream_copy(to, from, n) : (void)std::memmove(to, from, n);
  };
  const bool aliased = blocks[rank] == in;
  const size_t segment = std::max<size_t>(1, options.max_segment_bytes);
  for (size_t first = 0; first < bytes; first += segment) {
    const size_t n = std::min(segment, bytes - first);
    if (!aliased) copy(blocks[rank] + first, in + first, n);
    for (int step = 0; step < size - 1; ++step) {
      const size_t send_block = detail::wrap(rank - step, size);
      char* target = blocks[detail::wrap(rank - step - 1, size)] + first;
      transport.sendrecv(
          detail::wrap(rank + 1, size), {step == 0 ? in + first : blocks[send_block] + first, n},
          detail::wrap(rank - 1, size), n,
          [&](size_t offset, const void* piece, size_t piece_bytes) {
            copy(target + offset, static_cast<const char*>(piece), piece_bytes);
          },
          options.tag, options.deadline);
    }
  }
}

}  // namespace shardwise::collectives
