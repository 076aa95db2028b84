#include "core/crc32c.h"

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "temp_dir.h"

namespace zerodp {
namespace {

uint32_t crc_of(const std::vector<uint8_t>& bytes) {
  return crc32c(std::as_bytes(std::span(bytes)));
}

// The catalogue's check value and RFC 3720 appendix B.4's four 32-byte vectors.
TEST(Crc32c, MatchesThePublishedVectors) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(std::as_bytes(std::span(check))), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), up(32), down(32);
  for (uint8_t i = 0; i < 32; ++i) {
    up[i] = i;
    down[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc_of(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc_of(ones), 0x62A8AB43u);
  EXPECT_EQ(crc_of(up), 0x46DD794Eu);
  EXPECT_EQ(crc_of(down), 0x113FDB5Cu);
  EXPECT_EQ(crc_of({}), 0u);
}

// Fed in pieces of every length and alignment, by either path, the CRC is the one-shot one.
TEST(Crc32c, PiecesAndBothPathsGiveTheOneShotValue) {
  std::vector<uint8_t> data(4099);
  std::mt19937 rng(3);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = crc_of(data);
  for (size_t piece : {1, 3, 7, 8, 9, 64, 1000}) {
    Crc32c c;
    for (size_t at = 0; at < data.size(); at += piece) {
      c.update(data.data() + at, std::min(piece, data.size() - at));
    }
    EXPECT_EQ(c.value(), whole) << "pieces of " << piece;
  }
  if (!crc32c_detail::cpu_has_sse42()) GTEST_SKIP() << "no SSE4.2: the portable path only";
  for (size_t offset = 0; offset < 8; ++offset) {
    const uint8_t* p = data.data() + offset;
    const size_t n = data.size() - offset;
    const uint32_t portable = ~crc32c_detail::update_portable(0xFFFFFFFFu, p, n);
    EXPECT_EQ(~crc32c_detail::update_sse42(0xFFFFFFFFu, p, n), portable) << "offset " << offset;
  }
}

TEST(Crc32c, AFileHashesAsItsBytesAndAnyFlippedBitChangesIt) {
  testing::TempDir tmp;
  std::vector<uint8_t> data(3 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 >> 5);
  const auto path = tmp.path() / "f.bin";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  Crc32c c;
  c.update(data.data(), data.size());
  EXPECT_EQ(crc32c_file_hex(path), c.hex());
  EXPECT_EQ(c.hex().size(), 8u);
  for (size_t at : {size_t{0}, size_t{1} << 20, data.size() - 1}) {
    std::vector<uint8_t> flipped = data;
    flipped[at] ^= 0x10;
    EXPECT_NE(crc_of(flipped), c.value()) << "bit flipped at " << at;
  }
  EXPECT_THROW(crc32c_file_hex(tmp.path() / "absent"), IoError);
}

}  // namespace
}  // namespace zerodp
