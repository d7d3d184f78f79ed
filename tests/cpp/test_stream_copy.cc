// stream_copy must equal memcpy for every alignment of either side and every length around the
// vector widths (its aligned head, 128-byte body and tail are separate code paths).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/stream_copy.h"

namespace shardwise {
namespace {

TEST(StreamCopy, EqualsMemcpyForEveryAlignmentAndLength) {
  std::vector<uint8_t> source(4096 + 256), destination(source.size());
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t out_offset = 0; out_offset < 64; out_offset += 5) {
    for (size_t in_offset = 0; in_offset < 64; in_offset += 7) {
      for (size_t bytes : {0, 1, 63, 64, 127, 128, 129, 191, 255, 256, 1000, 4096}) {
        std::fill(destination.begin(), destination.end(), 0xAB);
        stream_copy(destination.data() + out_offset, source.data() + in_offset, bytes);
        for (size_t i = 0; i < destination.size(); ++i) {
          const bool inside = i >= out_offset && i < out_offset + bytes;
          const uint8_t want = inside ? source[in_offset + i - out_offset] : 0xAB;
          ASSERT_EQ(destination[i], want) << "out+" << out_offset << " in+" << in_offset << " "
                                          << bytes << " bytes, byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace shardwise
