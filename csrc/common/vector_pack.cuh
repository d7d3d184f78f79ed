// Packs for CUDA kernels that move kPackElements elements per thread step as 16-byte words
// (ld.global.v4 / st.global.v4): a Pack<T> holds kPackElements values of T, readable as `values`
// and loadable/storable as `words`. A kernel takes the pack path only where aligned16 holds for
// every pointer it touches, and casts the count % kPackElements tail element by element.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardwise {

constexpr int kPackElements = 8;

template <typename T>
union Pack {
  static_assert(kPackElements * sizeof(T) % sizeof(uint4) == 0, "a pack is whole 16-byte words");
  static constexpr int kWords = static_cast<int>(kPackElements * sizeof(T) / sizeof(uint4));
  uint4 words[kWords];
  T values[kPackElements];
};

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Pack `index` of `base` (elements index * kPackElements ...), loaded as 16-byte words.
template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* base, int64_t index) {
  Pack<T> pack;
  const uint4* from = reinterpret_cast<const uint4*>(base + index * kPackElements);
#pragma unroll
  for (int w = 0; w < Pack<T>::kWords; ++w) {
    pack.words[w] = from[w];
  }
  return pack;
}

template <typename T>
__device__ __forceinline__ void store_pack(T* base, int64_t index, const Pack<T>& pack) {
  uint4* to = reinterpret_cast<uint4*>(base + index * kPackElements);
#pragma unroll
  for (int w = 0; w < Pack<T>::kWords; ++w) {
    to[w] = pack.words[w];
  }
}

}  // namespace shardwise
