// allreduce: widen 16-bit floats to float32 (so every hop adds in float32 and the result is
// rounded once, to nearest even, identically on every rank), pick the one-step direct exchange
// for small messages and the ring otherwise (across hosts, the hierarchical all-reduce), then
// finish AVG by dividing by the group size.
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/reduce.h"

namespace shardwise::collectives {

void allreduce(Transport& transport, void* data, size_t count, const CollectiveOptions& options) {
  check_reduce(options.dtype, options.op);
  if (count == 0 || transport.size() == 1) {
    return;
  }
  const Datatype wide = accumulation_type(options.dtype);
  std::vector<float> widened;
  void* buffer = data;
  if (wide != options.dtype) {
    widened.resize(count);
    widen(data, widened.data(), count, options.dtype);
    buffer = widened.data();
  }
  CollectiveOptions wide_options = options;
  wide_options.dtype = wide;
  const auto hosts = options.hierarchical ? detail::host_layout(transport) : std::nullopt;
  if (hosts) {
    detail::allreduce_hierarchical(transport, *hosts, buffer, count, wide_options);
  } else if (count * element_size(options.dtype) <= options.small_message_bytes) {
    detail::allreduce_direct(transport, buffer, count, wide_options);
  } else {
    detail::allreduce_ring(transport, buffer, count, wide_options);
  }
  if (options.op == ReduceOp::kAvg) {
    finish_average(buffer, count, wide, transport.size());
  }
  if (wide != options.dtype) {
    narrow(widened.data(), data, count, options.dtype);
  }
}

detail::Chunk detail::chunk_of(size_t count, int parts, int index) {
  const size_t base = count / parts;
  const size_t extra = count % parts;
  const size_t c = static_cast<size_t>(index);
  return {c * base + (c < extra ? c : extra), base + (c < extra ? 1 : 0)};
}

}  // namespace shardwise::collectives
