// CUDA executor of copy runs: blockIdx.y picks a run (up to 65535 per launch, larger lists loop
// over launches), the x dimension grid-strides over its elements; every element goes through
// copy_element of copy_math.h, the function the CPU tests check. Where a run's pointers are
// 16-byte aligned, each thread step moves a pack of kPackElements elements as 16-byte words
// (common/vector_pack.cuh) and the count % kPackElements tail element by element.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/vector_pack.cuh"
#include "sharding/copy_runs.h"

namespace shardwise::sharding {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxRunsPerLaunch = 65535;
constexpr int64_t kMaxBlocksPerRun = 1024;

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
__global__ void copy_runs_kernel(const CopyRun* runs, double scale) {
  using Src = typename ElementTraits<kSrc>::Storage;
  using Dst = typename ElementTraits<kDst>::Storage;
  using Compute = ComputeType<kSrc, kDst>;
  const CopyRun run = runs[blockIdx.y];
  Dst* dst = static_cast<Dst*>(run.dst);
  const Src* src = static_cast<const Src*>(run.src);
  if (src == nullptr && kAccumulate) return;  // adding zeros
  const Compute factor = static_cast<Compute>(scale);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int64_t tail = 0;  // the first element copied one by one
  if (aligned16(dst) && (src == nullptr || aligned16(src))) {
    const int64_t packs = run.count / kPackElements;
    for (int64_t p = first; p < packs; p += stride) {
      copy_pack<kSrc, kDst, kAccumulate>(src, dst, p, factor);
    }
    tail = packs * kPackElements;
  }
  for (int64_t k = tail + first; k < run.count; k += stride) {
    dst[k] =
        src == nullptr ? Dst(0) : copy_element<kSrc, kDst, kAccumulate>(src[k], dst[k], factor);
  }
}

template <Element kSrc, Element kDst>
void launch_pair(const CopyRun* runs,
                 int64_t count,
                 dim3 grid,
                 const CopyRunsOptions& options,
                 cudaStream_t stream) {
  for (int64_t first = 0; first < count; first += kMaxRunsPerLaunch) {
    grid.y = static_cast<unsigned>(std::min(kMaxRunsPerLaunch, count - first));
    if (options.accumulate) {
      copy_runs_kernel<kSrc, kDst, true>
          <<<grid, kThreads, 0, stream>>>(runs + first, options.scale);
    } else {
      copy_runs_kernel<kSrc, kDst, false>
          <<<grid, kThreads, 0, stream>>>(runs + first, options.scale);
    }
  }
}

template <Element kSrc>
void launch_from(const CopyRun* runs,
                 int64_t count,
                 dim3 grid,
                 const CopyRunsOptions& options,
                 cudaStream_t stream) {
  switch (options.dst) {
    case Element::kFloat32:
      return launch_pair<kSrc, Element::kFloat32>(runs, count, grid, options, stream);
    case Element::kFloat64:
      return launch_pair<kSrc, Element::kFloat64>(runs, count, grid, options, stream);
    case Element::kBFloat16:
      return launch_pair<kSrc, Element::kBFloat16>(runs, count, grid, options, stream);
    case Element::kFloat16:
      return launch_pair<kSrc, Element::kFloat16>(runs, count, grid, options, stream);
  }
}

}  // namespace

void copy_runs_cuda(const CopyRun* device_runs,
                    int64_t count,
                    int64_t longest,
                    const CopyRunsOptions& options,
                    void* stream) {
  if (count == 0 || longest == 0) return;
  dim3 grid(static_cast<unsigned>(
      std::clamp<int64_t>((longest / kPackElements + kThreads) / kThreads, 1, kMaxBlocksPerRun)));
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  switch (options.src) {
    case Element::kFloat32:
      launch_from<Element::kFloat32>(device_runs, count, grid, options, cuda_stream);
      break;
    case Element::kFloat64:
      launch_from<Element::kFloat64>(device_runs, count, grid, options, cuda_stream);
      break;
    case Element::kBFloat16:
      launch_from<Element::kBFloat16>(device_runs, count, grid, options, cuda_stream);
      break;
    case Element::kFloat16:
      launch_from<Element::kFloat16>(device_runs, count, grid, options, cuda_stream);
      break;
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("copy_runs_cuda: kernel launch failed: ") +
                             cudaGetErrorString(error));
  }
}

}  // namespace shardwise::sharding
