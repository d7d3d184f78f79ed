// SHA-256 blocks with the SHA extensions, after Intel's description of them ("Intel SHA
// Extensions", 2013) and the public-domain SHA-Intrinsics code: the state is held as ABEF and
// CDGH, each sha256rnds2 does two rounds, and the message schedule of four rounds ahead is
// built with sha256msg1 / sha256msg2 from the last four groups of four words, kept in
// `words[0..3]` by group number mod 4.
#include "checkpoint/sha256_x86.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define SHARDWISE_SHA_NI 1
#endif

namespace shardwise::checkpoint {

#if SHARDWISE_SHA_NI

bool sha256_extensions_available() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool sha = (ebx >> 29) & 1;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool sse41 = (ecx >> 19) & 1, ssse3 = (ecx >> 9) & 1;
  return sha && sse41 && ssse3;
}

__attribute__((target("sha,sse4.1,ssse3"))) void sha256_blocks_x86(uint32_t state[8],
                                                                   const uint8_t* data,
                                                                   size_t blocks) {
  const __m128i big_endian = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state));       // DCBA
  __m128i cdgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4));  // HGFE
  tmp = _mm_shuffle_epi32(tmp, 0xB1);                                           // CDAB
  cdgh = _mm_shuffle_epi32(cdgh, 0x1B);                                         // EFGH
  __m128i abef = _mm_alignr_epi8(tmp, cdgh, 8);                                 // ABEF
  cdgh = _mm_blend_epi16(cdgh, tmp, 0xF0);                                      // CDGH
  for (; blocks > 0; --blocks, data += 64) {
    const __m128i abef_before = abef, cdgh_before = cdgh;
    __m128i words[4];
    for (int group = 0; group < 16; ++group) {  // rounds 4 * group .. 4 * group + 3
      __m128i& current = words[group % 4];
      if (group < 4) {
        current = _mm_shuffle_epi8(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * group)), big_endian);
      }
      __m128i message = _mm_add_epi32(
          current, _mm_load_si128(reinterpret_cast<const __m128i*>(kSha256Rounds + 4 * group)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, message);
      if (group >= 3 && group <= 14) {  // finish the words of group + 1
        __m128i& next = words[(group + 1) % 4];
        next = _mm_add_epi32(next, _mm_alignr_epi8(current, words[(group + 3) % 4], 4));
        next = _mm_sha256msg2_epu32(next, current);
      }
      message = _mm_shuffle_epi32(message, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, message);
      if (group >= 1 && group <= 12) {  // start the words of group + 3
        __m128i& later = words[(group + 3) % 4];
        later = _mm_sha256msg1_epu32(later, current);
      }
    }
    abef = _mm_add_epi32(abef, abef_before);
    cdgh = _mm_add_epi32(cdgh, cdgh_before);
  }
  tmp = _mm_shuffle_epi32(abef, 0x1B);      // FEBA
  cdgh = _mm_shuffle_epi32(cdgh, 0xB1);     // DCHG
  abef = _mm_blend_epi16(tmp, cdgh, 0xF0);  // DCBA
  cdgh = _mm_alignr_epi8(cdgh, tmp, 8);     // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), abef);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), cdgh);
}

#else

bool sha256_extensions_available() { return false; }

void sha256_blocks_x86(uint32_t*, const uint8_t*, size_t) {}

#endif

}  // namespace shardwise::checkpoint
