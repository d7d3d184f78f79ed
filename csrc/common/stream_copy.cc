#include "common/stream_copy.h"

#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace shardwise {

void stream_copy(void* destination, const void* source, size_t bytes) {
#if defined(__x86_64__)
  char* out = static_cast<char*>(destination);
  const char* in = static_cast<const char*>(source);
  const size_t head = (16 - reinterpret_cast<uintptr_t>(out) % 16) % 16;  // align the stores
  if (bytes < head + 64) {
    std::memcpy(out, in, bytes);
    return;
  }
  std::memcpy(out, in, head);
  size_t done = head;
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
  _mm_sfence();
#else
  std::memcpy(destination, source, bytes);
#endif
}

}  // namespace shardwise
