// Portability macros shared by the torch-free core and the CUDA kernels.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SW_HOST_DEVICE __host__ __device__
#define SW_INLINE __forceinline__
#else
#define SW_HOST_DEVICE
#define SW_INLINE inline __attribute__((always_inline))
#endif
