// Ring reduce-scatter on rank-major input: block b of `input` is the part rank b ends up owning.
//
// The work is a copy of the input in its accumulation type (float32 for 16-bit floats), handled
// in segments of at most max_segment_bytes per block. For a segment, step s = 0 .. size-2: rank r
// sends block (r - s - 1) to rank r + 1 and receives block (r - s - 2) from rank r - 1, reducing
// it straight out of the transport into its copy. After size - 1 steps block r holds the full
// reduction, which is averaged (AVG) and narrowed back into `output`.
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "precision/cast_kernels.h"

namespace shardwise::collectives {
namespace {

using precision::Format;

Format format_of(Datatype dtype) {
  return dtype == Datatype::kBFloat16 ? Format::kBFloat16 : Format::kFloat16;
}

void ring_segments(Transport& transport,
                   char* work,
                   size_t count,
                   const CollectiveOptions& options) {
  const int size = transport.size();
  const int rank = transport.rank();
  const size_t element = element_size(options.dtype);
  const size_t segment = std::max<size_t>(1, options.max_segment_bytes / element);
  for (size_t first = 0; first < count; first += segment) {
    const size_t n = std::min(segment, count - first);
    for (int step = 0; step < size - 1; ++step) {
      const size_t send_block = detail::wrap(rank - step - 1, size);
      const size_t recv_block = detail::wrap(rank - step - 2, size);
      char* target = work + (recv_block * count + first) * element;
      transport.sendrecv(
          detail::wrap(rank + 1, size),
          {work + (send_block * count + first) * element, n * element},
          detail::wrap(rank - 1, size), n * element,
          [&](size_t offset, const void* piece, size_t bytes) {
            reduce_into(target + offset, piece, bytes / element, options.dtype, options.op);
          },
          options.tag, options.deadline);
    }
  }
}

}  // namespace

void reduce_scatter(Transport& transport,
                    const void* input,
                    void* output,
                    size_t count,
                    const CollectiveOptions& options) {
  check_reduce(options.dtype, options.op);
  const int size = transport.size();
  const int rank = transport.rank();
  const Datatype wide = accumulation_type(options.dtype);
  const size_t total = count * size;
  std::vector<char> work(total * element_size(wide));
  if (wide != options.dtype) {
    precision::cast_cpu(input, work.data(), static_cast<int64_t>(total),
                        {format_of(options.dtype), Format::kFloat32}, active_cpu_isa());
  } else if (total > 0) {
    std::memcpy(work.data(), input, work.size());
  }
  CollectiveOptions wide_options = options;
  wide_options.dtype = wide;
  if (size > 1) ring_segments(transport, work.data(), count, wide_options);
  char* own = work.data() + rank * count * element_size(wide);
  if (options.op == ReduceOp::kAvg) finish_average(own, count, wide, size);
  if (wide != options.dtype) {
    precision::cast_cpu(own, output, static_cast<int64_t>(count),
                        {Format::kFloat32, format_of(options.dtype)}, active_cpu_isa());
  } else if (count > 0) {
    std::memcpy(output, own, count * element_size(wide));
  }
}

}  // namespace shardwise::collectives
