// The collective algorithms over a Transport, torch-free; one algorithm per file:
//   allreduce.cc          dispatch: 16-bit floats widened to float32, AVG, small vs large
//   allreduce_direct.cc   one step: everyone exchanges everything, reduces in rank order
//   allreduce_ring.cc     reduce-scatter then all-gather around the ring, in slabs
//   allreduce_hierarchical.cc  across hosts: the ring within each host, all-reduce across
//   reduce_scatter.cc     the ring's first phase on rank-major input
//   all_gather.cc         the ring's second phase
//   reduce_scatter_hierarchical.cc, all_gather_hierarchical.cc  across hosts: within each host
//                         over shared memory, across hosts between the ranks of one local rank
//   broadcast.cc          a chain from the root, in segments
//   alltoall.cc           size - 1 pairwise exchanges
//   barrier.cc            dissemination: ceil(log2 size) rounds of empty messages
//   tree_reduce.cc        deterministic all-reduce / reduce-scatter: the balanced binary tree
//                         over the rank index (power-of-two groups)
// Every rank must call the same collective with the same options (tag, counts); the tags catch
// the cases where they do not. All results are bit-identical on every rank.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "collectives/transport.h"
#include "collectives/types.h"

namespace shardwise::collectives {

// In place: `data` holds `count` elements on every rank and ends with their reduction.
void allreduce(Transport& transport, void* data, size_t count, const CollectiveOptions& options);

// `input` holds size * `count` elements, block r for rank r; `output` (count elements) receives
// the reduction of every rank's block `rank`.
void reduce_scatter(Transport& transport,
                    const void* input,
                    void* output,
                    size_t count,
                    const CollectiveOptions& options);

// Deterministic all-reduce and reduce-scatter (tree_reduce.cc): as allreduce / reduce_scatter
// (SUM or AVG of floating-point data, 16-bit floats added in float32 and rounded once), but each
// element is summed as the balanced binary tree over the rank index,
// ((x0 + x1) + (x2 + x3)) + .., whatever the sizes and the transport. The group size must be a
// power of two (std::invalid_argument otherwise, and for other ops or types).
void tree_allreduce(Transport& transport,
                    void* data,
                    size_t count,
                    const CollectiveOptions& options);
void tree_reduce_scatter(Transport& transport,
                         const void* input,
                         void* output,
                         size_t count,
                         const CollectiveOptions& options);

// `output` (size * `count` elements) receives every rank's `input` (count elements), rank-major.
// `input` may alias output block `rank`.
void all_gather(Transport& transport,
                const void* input,
                void* output,
                size_t count,
                const CollectiveOptions& options);

// `bytes` of `data` from rank `root` to every rank.
void broadcast(
    Transport& transport, void* data, size_t bytes, int root, const CollectiveOptions& options);

// Rank r sends send_bytes[p] bytes at input + send_offsets[p] to rank p and receives
// recv_bytes[p] bytes from rank p at output + recv_offsets[p].
void alltoall(Transport& transport,
              const void* input,
              const size_t* send_offsets,
              const size_t* send_bytes,
              void* output,
              const size_t* recv_offsets,
              const size_t* recv_bytes,
              const CollectiveOptions& options);

// Returns once every rank has entered the barrier.
void barrier(Transport& transport, const CollectiveOptions& options);

// Point to point: one message to / from `peer`.
void send(Transport& transport,
          int peer,
          const void* data,
          size_t bytes,
          const CollectiveOptions& options);
void recv(
    Transport& transport, int peer, void* data, size_t bytes, const CollectiveOptions& options);

// Receive from any source (recv_any.cc): the first of `peers` whose next message has begun to
// arrive (Transport::message_waiting); the caller then receives it with that peer's tag. Throws
// TransportError naming this rank and the peers at `deadline`.
int wait_for_any(Transport& transport, const std::vector<int>& peers, Clock::time_point deadline);

namespace detail {
// The algorithms behind allreduce, on a buffer of its accumulation type (no AVG division).
void allreduce_direct(Transport& transport,
                      void* data,
                      size_t count,
                      const CollectiveOptions& options);
void allreduce_ring(Transport& transport,
                    void* data,
                    size_t count,
                    const CollectiveOptions& options);
// The ring's two phases on one slab of `slab_count` elements (allreduce_ring.cc): after the
// reduce-scatter rank r holds the reduced chunk (r + 1) mod size; the all-gather spreads them.
void ring_reduce_scatter(Transport& transport,
                         char* slab,
                         size_t slab_count,
                         const CollectiveOptions& options);
void ring_all_gather(Transport& transport,
                     char* slab,
                     size_t slab_count,
                     const CollectiveOptions& options);
// A group spread over hosts (allreduce_hierarchical.cc): every host's ranks (`hosts`, hosts in
// the order of their numbers, each host's ranks in group order), this rank's host's (`local`) and
// the ranks with its local rank on every host (`across`, so across[h] = hosts[h][local rank]);
// none unless there are at least two hosts, each with the same number (two or more) of ranks.
struct HostLayout {
  std::vector<std::vector<int>> hosts;
  std::vector<int> local;
  std::vector<int> across;
};
std::optional<HostLayout> host_layout(const Transport& transport);
void allreduce_hierarchical(Transport& transport,
                            const HostLayout& layout,
                            void* data,
                            size_t count,
                            const CollectiveOptions& options);
// reduce_scatter and all_gather with the blocks anywhere: blocks[b] is where block b (rank b's)
// starts. all_gather_blocks copies `input` into blocks[rank] unless it is that block; its copies
// use streaming stores when `streaming`.
void reduce_scatter_blocks(Transport& transport,
                           const std::vector<const char*>& blocks,
                           void* output,
                           size_t count,
                           const CollectiveOptions& options);
void all_gather_blocks(Transport& transport,
                       const void* input,
                       const std::vector<char*>& blocks,
                       size_t count,
                       bool streaming,
                       const CollectiveOptions& options);
// Across hosts (reduce_scatter_hierarchical.cc, all_gather_hierarchical.cc), as reduce_scatter
// and all_gather.
void reduce_scatter_hierarchical(Transport& transport,
                                 const HostLayout& layout,
                                 const void* input,
                                 void* output,
                                 size_t count,
                                 const CollectiveOptions& options);
void all_gather_hierarchical(Transport& transport,
                             const HostLayout& layout,
                             const void* input,
                             void* output,
                             size_t count,
                             const CollectiveOptions& options);
// Chunk `index` of `count` elements split `parts` ways, lengths differing by at most one.
struct Chunk {
  size_t offset;
  size_t count;
};
Chunk chunk_of(size_t count, int parts, int index);
inline int wrap(int value, int size) { return ((value % size) + size) % size; }
}  // namespace detail

}  // namespace shardwise::collectives
