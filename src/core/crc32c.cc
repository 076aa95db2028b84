// crc32c.h is the contract.
#include "core/crc32c.h"

#include <array>
#include <cstring>

#include <fmt/core.h>

#include "core/files.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define ZERODP_CRC32C_SSE42 1
#endif

namespace zerodp {
namespace crc32c_detail {
namespace {

// The reflected polynomial 0x1EDC6F41.
constexpr uint32_t kPolynomial = 0x82F63B78u;

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ kPolynomial : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t update_portable(uint32_t state, const uint8_t* data, size_t size) {
  for (size_t i = 0; i < size; ++i) state = kTable[(state ^ data[i]) & 0xFF] ^ (state >> 8);
  return state;
}

#ifdef ZERODP_CRC32C_SSE42
bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}

[[gnu::target("sse4.2")]] uint32_t update_sse42(uint32_t state, const uint8_t* data, size_t size) {
  uint64_t c = state;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto s = static_cast<uint32_t>(c);
  for (; i < size; ++i) s = _mm_crc32_u8(s, data[i]);
  return s;
}
#else
bool cpu_has_sse42() { return false; }
uint32_t update_sse42(uint32_t state, const uint8_t* data, size_t size) {
  return update_portable(state, data, size);
}
#endif

}  // namespace crc32c_detail

void Crc32c::update(std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  state_ = crc32c_detail::cpu_has_sse42() ? crc32c_detail::update_sse42(state_, p, data.size())
                                          : crc32c_detail::update_portable(state_, p, data.size());
}

std::string Crc32c::hex() const { return fmt::format("{:08x}", value()); }

uint32_t crc32c(std::span<const std::byte> data) {
  Crc32c c;
  c.update(data);
  return c.value();
}

std::string crc32c_file_hex(const std::filesystem::path& path) {
  Crc32c c;
  files::read_in_chunks("crc32c", path, [&c](std::span<const std::byte> b) { c.update(b); });
  return c.hex();
}

}  // namespace zerodp
