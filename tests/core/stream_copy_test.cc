#include "core/stream_copy.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

namespace zerodp {
namespace {

// Every length around the streaming threshold and the 64-byte body, at every alignment of
// both ends: the bytes memcpy gives, and nothing past the end touched.
TEST(StreamCopy, GivesMemcpysBytesAtEveryAlignmentAndLength) {
  const size_t most = kStreamCopyMinBytes + 200;
  std::vector<uint8_t> src(most + 32);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + i / 251);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, kStreamCopyMinBytes - 1,
                         kStreamCopyMinBytes, kStreamCopyMinBytes + 1, kStreamCopyMinBytes + 63,
                         kStreamCopyMinBytes + 64, kStreamCopyMinBytes + 129}) {
    for (size_t from = 0; from < 17; from += 5) {
      for (size_t to = 0; to < 17; to += 3) {
        std::vector<uint8_t> dst(most + 64, 0xEE);
        stream_copy(dst.data() + to, src.data() + from, n);
        for (size_t i = 0; i < n; ++i) {
          if (dst[to + i] != src[from + i]) {
            FAIL() << "byte " << i << " of " << n << ", source +" << from << ", target +" << to;
          }
        }
        for (size_t i = 0; i < to; ++i) ASSERT_EQ(dst[i], 0xEE) << "before, " << n;
        for (size_t i = to + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "after, " << n;
      }
    }
  }
}

}  // namespace
}  // namespace zerodp
