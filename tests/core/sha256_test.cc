#include "core/sha256.h"

#include <array>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "temp_dir.h"

namespace zerodp {
namespace {

// FIPS 180-4 / NIST CAVP example vectors.
TEST(Sha256, EmptyString) {
  EXPECT_EQ(sha256_hex(std::string_view("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, Abc) {
  EXPECT_EQ(sha256_hex(std::string_view("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, TwoBlockMessage) {
  EXPECT_EQ(
      sha256_hex(std::string_view("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, MillionAs) {
  const std::string a(1000000, 'a');
  EXPECT_EQ(sha256_hex(std::string_view(a)),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalChunksEqualOneShot) {
  // Chunk sizes straddle the 64-byte block and the 56-byte padding boundary.
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + (i * 7) % 26);
  const std::string expected = sha256_hex(std::string_view(text));
  for (size_t chunk : {1u, 3u, 55u, 56u, 63u, 64u, 65u, 127u, 999u}) {
    Sha256 h;
    for (size_t pos = 0; pos < text.size(); pos += chunk) {
      h.update(std::string_view(text).substr(pos, chunk));
    }
    EXPECT_EQ(h.hex_digest(), expected) << "chunk " << chunk;
    EXPECT_EQ(h.size_bytes(), text.size());
  }
}

// The vectors above go through whichever compression this CPU uses; here the SHA-extensions
// path and the portable one must agree on many blocks of varied bytes, from varied states.
TEST(Sha256, ShaExtensionsAgreeWithThePortableRounds) {
  if (!sha256_detail::cpu_has_sha_extensions()) {
    GTEST_SKIP() << "this CPU has no SHA extensions; the portable rounds are the only path";
  }
  std::vector<uint8_t> blocks(64 * 257);
  uint32_t x = 12345;
  for (auto& b : blocks) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  std::array<uint32_t, 8> portable = {1, 2, 3, 4, 5, 6, 7, 0xffffffffu}, extensions = portable;
  for (size_t count : {size_t{1}, size_t{2}, size_t{7}, size_t{247}}) {
    sha256_detail::compress_portable(portable, blocks.data(), count);
    sha256_detail::compress_sha_extensions(extensions, blocks.data(), count);
    EXPECT_EQ(portable, extensions) << count << " blocks";
  }
}

TEST(Sha256, DigestLeavesHashOpen) {
  Sha256 h;
  h.update(std::string_view("ab"));
  EXPECT_EQ(h.hex_digest(), sha256_hex(std::string_view("ab")));
  h.update(std::string_view("c"));
  EXPECT_EQ(h.hex_digest(), sha256_hex(std::string_view("abc")));
}

TEST(Sha256, PaddingBoundaryLengths) {
  // Lengths 55, 56 and 64 exercise one and two padding blocks; compare with known digests
  // of runs of 'a' (computed with coreutils sha256sum).
  EXPECT_EQ(sha256_hex(std::string_view(std::string(55, 'a'))),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string_view(std::string(56, 'a'))),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string_view(std::string(64, 'a'))),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, U64LittleEndianMatchesBytes) {
  const std::vector<uint64_t> values = {1, 0x0102030405060708ULL, ~uint64_t{0}};
  const uint8_t bytes[] = {1, 0, 0, 0, 0,    0,    0,    0,    8,    7,    6,    5,
                           4, 3, 2, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  Sha256 from_values;
  sha256_update_u64_le(from_values, values);
  Sha256 from_bytes;
  from_bytes.update(bytes, sizeof(bytes));
  EXPECT_EQ(from_values.hex_digest(), from_bytes.hex_digest());
}

TEST(Sha256, FileDigestEqualsMemoryDigest) {
  testing::TempDir dir;
  const auto path = dir.path() / "f.bin";
  std::string content(3 * (1 << 20) + 17, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 31 % 251);
  std::ofstream(path, std::ios::binary) << content;
  EXPECT_EQ(sha256_file_hex(path), sha256_hex(std::string_view(content)));
}

TEST(Sha256, MissingFileIsIoErrorNamingIt) {
  try {
    sha256_file_hex("/nonexistent/zerodp-file");
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/zerodp-file"), std::string::npos);
  }
}

}  // namespace
}  // namespace zerodp
