// Hierarchical reduce-scatter, for a group whose ranks sit on H >= 2 hosts of R >= 2 ranks each
// (HostLayout): rank r, local rank l on its host, must end with the reduction of every rank's
// block r.
//   1. `grouped`: this rank's input regrouped by the local rank that reduces it: group l holds
//      blocks hosts[0][l], .., hosts[H - 1][l], that is the blocks of the ranks in local rank l's
//      `across`, in that order.
//   2. Within each host, one ring reduce-scatter of the R groups over shared memory: local rank l
//      receives its host's `partial` sum of group l.
//   3. Across hosts, the ranks of one local rank (across) reduce-scatter `partial`'s H blocks over
//      TCP: across[h] receives the sum over hosts of its block, which is the result.
// Each host's link carries (H - 1) / H of one rank's input each way in H - 1 steps, where the flat
// ring over all n = H R ranks sends (n - 1) / n of it across each host boundary in n - 1 steps;
// within the host it takes R - 1 steps, as one host's ring would. Both stages run on the
// accumulation type (float32 for 16-bit floats: the regrouping widens) with AVG as a sum, so the
// result is divided and rounded once, as the flat ring's is. The order of the additions differs
// from the flat ring's: inexact floating-point sums may differ from it in the last bits; exact
// data gives the same result.
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
  const size_t in_element = element_size(options.dtype);
  const size_t hosts = layout.hosts.size();
  const size_t per_host = layout.local.size();
  const size_t group_bytes = hosts * count * element;
  std::vector<char> grouped(per_host * group_bytes);
  for (size_t l = 0; l < per_host; ++l) {
    for (size_t h = 0; h < hosts; ++h) {
      const char* from = static_cast<const char*>(input) + layout.hosts[h][l] * count * in_element;
      char* to = grouped.data() + l * group_bytes + h * count * element;
      wide != options.dtype ? widen(from, to, count, options.dtype)
                            : (void)std::memcpy(to, from, count * element);
    }
  }
  CollectiveOptions sum = options;
  sum.dtype = wide;
  if (sum.op == ReduceOp::kAvg) sum.op = ReduceOp::kSum;
  std::vector<const char*> blocks;
  for (size_t l = 0; l < per_host; ++l) blocks.push_back(grouped.data() + l * group_bytes);
  std::vector<char> partial(group_bytes);
  reduce_scatter_blocks(local, blocks, partial.data(), hosts * count, sum);
  blocks.clear();
  for (size_t h = 0; h < hosts; ++h) blocks.push_back(partial.data() + h * count * element);
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
