// Hierarchical all-gather, for a group whose ranks sit on H >= 2 hosts of R >= 2 ranks each
// (HostLayout): every rank's input goes to its block of everyone's output.
//   1. Across hosts, the ranks of one local rank (across) all-gather their inputs over TCP into
//      their blocks of the output: local rank l then holds blocks hosts[0][l], .., hosts[H-1][l].
//   2. Within each host, one ring all-gather over shared memory of those H blocks per local rank,
//      packed: `packed` holds local rank l' 's H blocks at l' H, in host order (this rank's
//      copied in, the others' received), then each goes to its block of the output.
// Each host's link carries the (H - 1) R blocks of the other hosts' ranks once, in H - 1 steps,
// where the flat ring over all n = H R ranks sends n - 1 blocks across each host boundary in
// n - 1 steps; within the host it takes R - 1 steps, as one host's ring would. Only copies: the
// output is bit-identical to the flat ring's.
#include <cstring>
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
  const size_t hosts = layout.hosts.size();
  const size_t per_host = layout.local.size();
  const bool streaming = bytes * static_cast<size_t>(transport.size()) >= options.streaming_bytes;
  char* out = static_cast<char*>(output);
  std::vector<char*> blocks;
  for (int member : layout.across) blocks.push_back(out + member * bytes);
  all_gather_blocks(across, input, blocks, count, streaming, options);
  std::vector<char> packed(per_host * hosts * bytes);
  const size_t mine = static_cast<size_t>(local.rank());
  for (size_t h = 0; h < hosts; ++h) {
    std::memcpy(packed.data() + (mine * hosts + h) * bytes, blocks[h], bytes);
  }
  blocks.clear();
  for (size_t l = 0; l < per_host; ++l) blocks.push_back(packed.data() + l * hosts * bytes);
  all_gather_blocks(local, blocks[mine], blocks, hosts * count, false, options);
  for (size_t l = 0; l < per_host; ++l) {
    if (l == mine) continue;
    for (size_t h = 0; h < hosts; ++h) {
      std::memcpy(out + layout.hosts[h][l] * bytes, packed.data() + (l * hosts + h) * bytes, bytes);
    }
  }
}

}  // namespace shardwise::collectives::detail
