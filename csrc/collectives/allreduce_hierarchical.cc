// Hierarchical all-reduce, for a group whose ranks sit on several hosts (Transport::host_of),
// every host with the same number R >= 2 of them, H >= 2 hosts:
//   1. within each host, the ring's reduce-scatter (shared memory): local rank l ends holding its
//      host's partial reduction of chunk (l + 1) mod R;
//   2. across hosts, the ranks with local rank l (one per host) all-reduce that chunk (TCP):
//      R such all-reduces run at once, each over 1 / R of the data;
//   3. within each host, the ring's all-gather.
// Small messages take the same path with the one-step direct exchange in place of both rings.
// Each host's link then carries 2 (H - 1) / H of the buffer each way, in 2 (H - 1) steps, where
// the flat ring over all n = H R ranks sends 2 (n - 1) / n of it across each host boundary in
// 2 (n - 1) steps. Every element is reduced on one rank, then copied: all ranks end bit-identical
// (the order of the reduction differs from the flat ring's, so floating-point sums may differ
// from it in the last bits; exact data gives the same result).
#include <algorithm>
#include <map>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "collectives/subgroup_transport.h"

namespace shardwise::collectives::detail {

std::optional<HostLayout> host_layout(const Transport& transport) {
  const std::vector<int> host_of = transport.host_of();
  if (host_of.empty() || static_cast<int>(host_of.size()) != transport.size()) return std::nullopt;
  std::map<int, std::vector<int>> ranks_of;  // host -> its ranks, in group order
  for (int r = 0; r < transport.size(); ++r) ranks_of[host_of[r]].push_back(r);
  const size_t per_host = ranks_of.begin()->second.size();
  if (ranks_of.size() < 2 || per_host < 2) return std::nullopt;
  for (const auto& [host, ranks] : ranks_of)
    if (ranks.size() != per_host) return std::nullopt;
  HostLayout layout;
  for (const auto& [host, ranks] : ranks_of) layout.hosts.push_back(ranks);
  layout.local = ranks_of.at(host_of[transport.rank()]);
  const auto place = std::find(layout.local.begin(), layout.local.end(), transport.rank());
  const size_t local_rank = static_cast<size_t>(place - layout.local.begin());
  for (const auto& [host, ranks] : ranks_of) layout.across.push_back(ranks[local_rank]);
  return layout;
}

void allreduce_hierarchical(Transport& transport,
                            const HostLayout& layout,
                            void* data,
                            size_t count,
                            const CollectiveOptions& options) {
  SubgroupTransport local(transport, layout.local);
  SubgroupTransport across(transport, layout.across);
  const size_t element = element_size(options.dtype);
  if (count * element <= options.small_message_bytes) {
    allreduce_direct(local, data, count, options);
    allreduce_direct(across, data, count, options);
    return;
  }
  const size_t segment_count = std::max<size_t>(1, options.max_segment_bytes / element);
  const size_t slab_capacity = segment_count * static_cast<size_t>(local.size());
  char* bytes = static_cast<char*>(data);
  for (size_t offset = 0; offset < count; offset += slab_capacity) {
    char* slab = bytes + offset * element;
    const size_t slab_count = std::min(slab_capacity, count - offset);
    ring_reduce_scatter(local, slab, slab_count, options);
    const Chunk mine = chunk_of(slab_count, local.size(), wrap(local.rank() + 1, local.size()));
    if (mine.count * element <= options.small_message_bytes) {
      allreduce_direct(across, slab + mine.offset * element, mine.count, options);
    } else {
      allreduce_ring(across, slab + mine.offset * element, mine.count, options);
    }
    ring_all_gather(local, slab, slab_count, options);
  }
}

}  // namespace shardwise::collectives::detail
