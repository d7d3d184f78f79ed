// Copy tiles: how the CUDA executor of copy runs (copy_runs_cuda.cu) spreads a run list over
// thread blocks so that every block has work. Each run is cut into tiles of kTileElements elements
// (its last tile shorter); the tiles of all runs are numbered in run order, and block b copies tile
// b. tile_starts holds, for each run r, the number of its first tile, and one more entry, the
// total: run r owns tiles [tile_starts[r], tile_starts[r + 1]), so a block finds its run by binary
// search (run_of_tile) and its elements as tile_range. A run of count 0 owns no tile.
//
// Why tiles and not one grid row per run: a grid sized by the longest run leaves the blocks of
// short runs (biases, norms) empty, and a GPT's parameter list launched that way spent most of the
// kernel scheduling empty blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "common/macros.h"
#include "sharding/copy_runs.h"

namespace shardwise::sharding {

// 256 threads x 4 packs of 8 elements: a multiple of the pack, so every tile but a run's last
// starts and ends on a pack boundary.
constexpr int64_t kTileElements = 8192;

inline int64_t tiles_of(int64_t count) { return (count + kTileElements - 1) / kTileElements; }

// tile_starts of `runs` (count + 1 entries; the last is the number of tiles).
inline std::vector<int64_t> tile_starts_of(const CopyRun* runs, int64_t count) {
  std::vector<int64_t> starts(static_cast<size_t>(count) + 1, 0);
  for (int64_t r = 0; r < count; ++r) {
    starts[r + 1] = starts[r] + tiles_of(runs[r].count);
  }
  return starts;
}

// The run owning `tile`: the last r with tile_starts[r] <= tile (runs of no tile are skipped,
// since their start equals the next run's). Requires 0 <= tile < tile_starts[count].
SW_HOST_DEVICE SW_INLINE int64_t run_of_tile(const int64_t* tile_starts,
                                             int64_t count,
                                             int64_t tile) {
  int64_t low = 0;
  int64_t high = count - 1;
  while (low < high) {  // invariant: the answer is in [low, high]
    const int64_t mid = (low + high + 1) / 2;
    if (tile_starts[mid] <= tile) {
      low = mid;
    } else {
      high = mid - 1;
    }
  }
  return low;
}

struct TileRange {
  int64_t begin;  // first element of the run in this tile
  int64_t end;    // one past the last
};

// The elements of `run_count` that tile number `tile_in_run` of the run covers.
SW_HOST_DEVICE SW_INLINE TileRange tile_range(int64_t run_count, int64_t tile_in_run) {
  const int64_t begin = tile_in_run * kTileElements;
  const int64_t end = begin + kTileElements < run_count ? begin + kTileElements : run_count;
  return {begin, end};
}

}  // namespace shardwise::sharding
