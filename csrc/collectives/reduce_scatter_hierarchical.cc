// Hierarchical reduce-scatter, for a group whose ranks sit on H >= 2 hosts of R >= 2 ranks each
// (HostLayout): rank r, local rank l on its host, must end with the reduction of every rank's
// block r.
//   1. Within each host, for every host h, a ring reduce-scatter over shared memory of the blocks
//      of hosts[h]'s ranks: local rank l receives its host's `partial` sum of block hosts[h][l],
//      that is of block across[h]. The H partials lie in `partial`, in the order of `across`.
//   2. Across hosts, the ranks of one local rank (across) reduce-scatter `partial` over TCP:
//      across[h] receives the sum over hosts of its block, which is the result.
// Each host's link carries (H - 1) / H of one rank's input each way in H - 1 steps, where the flat
// ring over all n = H R ranks sends (n - 1) / n of it across each host boundary in n - 1 steps.
// Both stages run on the accumulation type (float32 for 16-bit floats, the input widened first)
// with AVG as a sum, so the result is divided and rounded once, as the flat ring's is. The order
// of the additions differs from the flat ring's: inexact floating-point sums may differ from it
// in the last bits; exact data gives the same result.
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "collectives/subgroup_transport.h"

namespace shardwise::collectives::detail {

void reduce_scatter_hierarchical(Transport& transport,
                                 const HostLayout& layout,
                                 const void* input,
                                 void* output,
                                 size_t count,
                                 const CollectiveOptions& options) {
  SubgroupTransport local(transport, layout.local);
  SubgroupTransport across(transport, layout.across);
  const Datatype wide = accumulation_type(options.dtype);
  const size_t element = element_size(wide);
  const size_t total = count * static_cast<size_t>(transport.size());
  std::vector<char> widened;
  const char* in = static_cast<const char*>(input);
  if (wide != options.dtype) {
    widened.resize(total * element);
    widen(input, widened.data(), total, options.dtype);
    in = widened.data();
  }
  CollectiveOptions sum = options;
  sum.dtype = wide;
  if (sum.op == ReduceOp::kAvg) sum.op = ReduceOp::kSum;
  std::vector<char> partial(layout.hosts.size() * count * element);
  std::vector<const char*> blocks;
  for (size_t h = 0; h < layout.hosts.size(); ++h) {
    blocks.clear();
    for (int member : layout.hosts[h]) blocks.push_back(in + member * count * element);
    reduce_scatter_blocks(local, blocks, partial.data() + h * count * element, count, sum);
  }
  blocks.clear();
  for (size_t h = 0; h < layout.hosts.size(); ++h) {
    blocks.push_back(partial.data() + h * count * element);
  }
  std::vector<char> result;
  void* reduced = output;
  if (wide != options.dtype) {
    result.resize(count * element);
    reduced = result.data();
  }
  reduce_scatter_blocks(across, blocks, reduced, count, sum);
  if (options.op == ReduceOp::kAvg) finish_average(reduced, count, wide, transport.size());
  if (wide != options.dtype) narrow(result.data(), output, count, options.dtype);
}

}  // namespace shardwise::collectives::detail
