// CUDA executor of copy runs: one block per tile (copy_tiles.h); a block finds its run by binary
// search over the tile starts and grid-strides its threads over the tile's elements. Every element
// goes through copy_element of copy_math.h, the function the CPU tests check. Where a run's
// pointers are 16-byte aligned, each thread step moves a pack of kPackElements elements as
// 16-byte words (common/vector_pack.cuh) and the count % kPackElements tail, in the run's last
// tile, element by element.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/vector_pack.cuh"
#include "sharding/copy_runs.h"
#include "sharding/copy_tiles.h"

namespace shardwise::sharding {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxTilesPerLaunch = int64_t{1} << 30;
static_assert(kTileElements % (kThreads * kPackElements) == 0, "a tile is whole packs per thread");

// Pack `p` of a run: dst = copy_element(src, dst) for its kPackElements elements.
template <Element kSrc, Element kDst, bool kAccumulate, typename Compute>
__device__ __forceinline__ void copy_pack(const typename ElementTraits<kSrc>::Storage* src,
                                          typename ElementTraits<kDst>::Storage* dst,
                                          int64_t p,
                                          Compute factor) {
  using Dst = typename ElementTraits<kDst>::Storage;
  Pack<Dst> out;
  if (src == nullptr) {
#pragma unroll
    for (int k = 0; k < kPackElements; ++k) out.values[k] = Dst(0);
  } else {
    const auto in = load_pack(src, p);
    if (kAccumulate) out = load_pack(dst, p);
#pragma unroll
    for (int k = 0; k < kPackElements; ++k) {
      out.values[k] = copy_element<kSrc, kDst, kAccumulate>(in.values[k], out.values[k], factor);
    }
  }
  store_pack(dst, p, out);
}

template <Element kSrc, Element kDst, bool kAccumulate>
__global__ void copy_runs_kernel(const CopyRun* runs,
                                 const int64_t* tile_starts,
                                 int64_t count,
                                 int64_t first_tile,
                                 double scale) {
  using Src = typename ElementTraits<kSrc>::Storage;
  using Dst = typename ElementTraits<kDst>::Storage;
  using Compute = ComputeType<kSrc, kDst>;
  const int64_t tile = first_tile + blockIdx.x;
  const int64_t r = run_of_tile(tile_starts, count, tile);
  const CopyRun run = runs[r];
  Dst* dst = static_cast<Dst*>(run.dst);
  const Src* src = static_cast<const Src*>(run.src);
  if (src == nullptr && kAccumulate) return;  // adding zeros
  const Compute factor = static_cast<Compute>(scale);
  const TileRange range = tile_range(run.count, tile - tile_starts[r]);
  int64_t tail = range.begin;  // the first element copied one by one
  if (aligned16(dst) && (src == nullptr || aligned16(src))) {
    // range.begin is a multiple of kPackElements (kTileElements is).
    const int64_t packs_end = range.end / kPackElements;
    for (int64_t p = range.begin / kPackElements + threadIdx.x; p < packs_end; p += kThreads) {
      copy_pack<kSrc, kDst, kAccumulate>(src, dst, p, factor);
    }
    tail = packs_end * kPackElements > range.begin ? packs_end * kPackElements : range.begin;
  }
  for (int64_t k = tail + threadIdx.x; k < range.end; k += kThreads) {
    dst[k] =
        src == nullptr ? Dst(0) : copy_element<kSrc, kDst, kAccumulate>(src[k], dst[k], factor);
  }
}

struct Launch {
  const CopyRun* runs;
  const int64_t* tile_starts;
  int64_t count;
  int64_t tiles;
  cudaStream_t stream;
};

template <Element kSrc, Element kDst>
void launch_pair(const Launch& launch, const CopyRunsOptions& options) {
  for (int64_t first = 0; first < launch.tiles; first += kMaxTilesPerLaunch) {
    const dim3 grid(static_cast<unsigned>(std::min(kMaxTilesPerLaunch, launch.tiles - first)));
    if (options.accumulate) {
      copy_runs_kernel<kSrc, kDst, true><<<grid, kThreads, 0, launch.stream>>>(
          launch.runs, launch.tile_starts, launch.count, first, options.scale);
    } else {
      copy_runs_kernel<kSrc, kDst, false><<<grid, kThreads, 0, launch.stream>>>(
          launch.runs, launch.tile_starts, launch.count, first, options.scale);
    }
  }
}

template <Element kSrc>
void launch_from(const Launch& launch, const CopyRunsOptions& options) {
  switch (options.dst) {
    case Element::kFloat32:
      return launch_pair<kSrc, Element::kFloat32>(launch, options);
    case Element::kFloat64:
      return launch_pair<kSrc, Element::kFloat64>(launch, options);
    case Element::kBFloat16:
      return launch_pair<kSrc, Element::kBFloat16>(launch, options);
    case Element::kFloat16:
      return launch_pair<kSrc, Element::kFloat16>(launch, options);
  }
}

}  // namespace

void copy_runs_cuda(const CopyRun* device_runs,
                    const int64_t* device_tile_starts,
                    int64_t count,
                    int64_t tiles,
                    const CopyRunsOptions& options,
                    void* stream) {
  if (count == 0 || tiles == 0) return;
  const Launch launch{device_runs, device_tile_starts, count, tiles,
                      static_cast<cudaStream_t>(stream)};
  switch (options.src) {
    case Element::kFloat32:
      launch_from<Element::kFloat32>(launch, options);
      break;
    case Element::kFloat64:
      launch_from<Element::kFloat64>(launch, options);
      break;
    case Element::kBFloat16:
      launch_from<Element::kBFloat16>(launch, options);
      break;
    case Element::kFloat16:
      launch_from<Element::kFloat16>(launch, options);
      break;
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("copy_runs_cuda: kernel launch failed: ") +
                             cudaGetErrorString(error));
  }
}

}  // namespace shardwise::sharding
