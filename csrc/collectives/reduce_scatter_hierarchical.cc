// Hierarchical reduce-scatter, for a group whose ranks sit on H >= 2 hosts of R >= 2 ranks each
// (HostLayout): rank r, local rank l on its host, must end with the reduction of every rank's
// block r.
//   1. Within each host, over shared memory, local rank l receives its host's `partial` sum of
//      blocks hosts[0][l], .., hosts[H - 1][l] (the blocks of the ranks in its `across`, in that
//      order), in one of two ways:
//      - grouped: the input copied into `grouped`, regrouped by the local rank that reduces it
//        (group l holds those H blocks), then one ring reduce-scatter of the R groups: R - 1
//        hand-offs per segment of a group. Taken for blocks of at most grouped_block_bytes
//        (CollectiveOptions: H times fewer hand-offs than per host, for one copy) and where the
//        input must be widened anyway;
//      - per host: for each host h, a ring reduce-scatter of hosts[h]'s blocks, straight from the
//        input: no copy, and as many hand-offs as grouped once a block spans segments.
//   2. Across hosts, the ranks of one local rank (across) reduce-scatter `partial`'s H blocks over
//      TCP: across[h] receives the sum over hosts of its block, which is the result.
// Each host's link carries (H - 1) / H of one rank's input each way in H - 1 steps, where the flat
// ring over all n = H R ranks sends (n - 1) / n of it across each host boundary in n - 1 steps.
// Both stages run on the accumulation type (float32 for 16-bit floats) with AVG as a sum, so the
// result is divided and rounded once, as the flat ring's is. The order of the additions differs
// from the flat ring's: inexact floating-point sums may differ from it in the last bits; exact
// data gives the same result.
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "collectives/subgroup_transport.h"

namespace shardwise::collectives::detail {
namespace {

// Stage 1, grouped: the input regrouped (and widened) into R groups of H blocks, one pass.
void reduce_within_grouped(SubgroupTransport& local,
                           const HostLayout& layout,
                           const void* input,
                           char* partial,
                           size_t count,
                           Datatype dtype,
                           const CollectiveOptions& sum) {
  const size_t element = element_size(sum.dtype);
  const size_t in_element = element_size(dtype);
  const size_t hosts = layout.hosts.size();
  const size_t group_bytes = hosts * count * element;
  std::vector<char> grouped(layout.local.size() * group_bytes);
  std::vector<const char*> blocks;
  for (size_t l = 0; l < layout.local.size(); ++l) {
    for (size_t h = 0; h < hosts; ++h) {
      const char* from = static_cast<const char*>(input) + layout.hosts[h][l] * count * in_element;
      char* to = grouped.data() + l * group_bytes + h * count * element;
      sum.dtype != dtype ? widen(from, to, count, dtype)
                         : (void)std::memcpy(to, from, count * element);
    }
    blocks.push_back(grouped.data() + l * group_bytes);
  }
  reduce_scatter_blocks(local, blocks, partial, hosts * count, sum);
}

// Stage 1, per host: one pass per host, on the input where it is (its type needs no widening).
void reduce_within_per_host(SubgroupTransport& local,
                            const HostLayout& layout,
                            const void* input,
                            char* partial,
                            size_t count,
                            const CollectiveOptions& sum) {
  const size_t element = element_size(sum.dtype);
  std::vector<const char*> blocks;
  for (size_t h = 0; h < layout.hosts.size(); ++h) {
    blocks.clear();
    for (int member : layout.hosts[h]) {
      blocks.push_back(static_cast<const char*>(input) + member * count * element);
    }
    reduce_scatter_blocks(local, blocks, partial + h * count * element, count, sum);
  }
}

}  // namespace

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
  const size_t hosts = layout.hosts.size();
  CollectiveOptions sum = options;
  sum.dtype = wide;
  if (sum.op == ReduceOp::kAvg) sum.op = ReduceOp::kSum;
  std::vector<char> partial(hosts * count * element);
  if (wide != options.dtype || count * element <= options.grouped_block_bytes) {
    reduce_within_grouped(local, layout, input, partial.data(), count, options.dtype, sum);
  } else {
    reduce_within_per_host(local, layout, input, partial.data(), count, sum);
  }
  std::vector<const char*> blocks;
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
