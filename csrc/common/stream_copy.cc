#include "common/stream_copy.h"

#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace shardwise {
namespace {

#if defined(__x86_64__)
// Bytes to copy with ordinary stores before `out` reaches a 64-byte boundary.
size_t head_bytes(const char* out) { return (64 - reinterpret_cast<uintptr_t>(out) % 64) % 64; }

// SSE2 (every x86-64): four 16-byte streaming stores fill one cache line.
void stream_copy_sse2(char* out, const char* in, size_t bytes) {
  size_t done = 0;
  for (; done + 64 <= bytes; done += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 48), d);
  }
  std::memcpy(out + done, in + done, bytes - done);
}

// AVX-512: one streaming store per cache line.
__attribute__((target("avx512f"))) void stream_copy_avx512(char* out,
                                                           const char* in,
                                                           size_t bytes) {
  size_t done = 0;
  for (; done + 128 <= bytes; done += 128) {
    const __m512i a = _mm512_loadu_si512(in + done);
    const __m512i b = _mm512_loadu_si512(in + done + 64);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out + done), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(out + done + 64), b);
  }
  std::memcpy(out + done, in + done, bytes - done);
}

bool has_avx512f() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
}
#endif

}  // namespace

void stream_copy(void* destination, const void* source, size_t bytes) {
#if defined(__x86_64__)
  char* out = static_cast<char*>(destination);
  const char* in = static_cast<const char*>(source);
  const size_t head = head_bytes(out);
  if (bytes < head + 128) {
    std::memcpy(out, in, bytes);
    return;
  }
  std::memcpy(out, in, head);
  if (has_avx512f()) {
    stream_copy_avx512(out + head, in + head, bytes - head);
  } else {
    stream_copy_sse2(out + head, in + head, bytes - head);
  }
  _mm_sfence();
#else
  std::memcpy(destination, source, bytes);
#endif
}

}  // namespace shardwise
