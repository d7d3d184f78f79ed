// Hierarchical all-gather, for a group whose ranks sit on H >= 2 hosts of R >= 2 ranks each
// (HostLayout): every rank's input goes to its block of everyone's output.
//   1. Across hosts, the ranks of one local rank (across) all-gather their inputs over TCP into
//      their blocks of the output.
//   2. Within each host, for every host h, a ring all-gather over shared memory of the blocks of
//      hosts[h]'s ranks: local rank l holds block hosts[h][l] (= across[h]) since stage 1.
// Each host's link then carries the (H - 1) R blocks of the other hosts' ranks once, in H - 1
// steps, where the flat ring over all n = H R ranks sends n - 1 blocks across each host boundary
// in n - 1 steps. Only copies: the output is bit-identical to the flat ring's. Stage 2 takes
// H (R - 1) hand-offs for a small message; packing each rank's H blocks into one ring pass (R - 1
// hand-offs) was measured slower on 4 x 2 emulated hosts at every size (the copies cost more than
// the hand-offs saved there; 7773552), so it is not done.
#include <vector>

#include "collectives/collectives.h"
#include "collectives/subgroup_transport.h"

namespace shardwise::collectives::detail {

void all_gather_hierarchical(Transport& transport,
                             const HostLayout& layout,
                             const void* input,
                             void* output,
                             size_t count,
                             const CollectiveOptions& options) {
  SubgroupTransport local(transport, layout.local);
  SubgroupTransport across(transport, layout.across);
  const size_t bytes = count * element_size(options.dtype);
  const bool streaming = bytes * static_cast<size_t>(transport.size()) >= options.streaming_bytes;
  char* out = static_cast<char*>(output);
  std::vector<char*> blocks;
  for (int member : layout.across) blocks.push_back(out + member * bytes);
  all_gather_blocks(across, input, blocks, count, streaming, options);
  for (const std::vector<int>& host : layout.hosts) {
    blocks.clear();
    for (int member : host) blocks.push_back(out + member * bytes);
    all_gather_blocks(local, blocks[local.rank()], blocks, count, streaming, options);
  }
}

}  // namespace shardwise::collectives::detail
