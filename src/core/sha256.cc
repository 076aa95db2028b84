#include "core/sha256.h"

#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "core/files.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace zerodp {
namespace {

constexpr std::array<uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr std::array<uint32_t, 8> kInitialState = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

}  // namespace

namespace sha256_detail {
namespace {

void compress_one(std::array<uint32_t, 8>& state, const uint8_t* block) {
  std::array<uint32_t, 64> w;
  for (int t = 0; t < 16; ++t) {
    // Big-endian words by arithmetic, so the result does not depend on host byte order.
    w[t] = (uint32_t{block[4 * t]} << 24) | (uint32_t{block[4 * t + 1]} << 16) |
           (uint32_t{block[4 * t + 2]} << 8) | uint32_t{block[4 * t + 3]};
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + s1 + ch + kRoundConstants[t] + w[t];
    const uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state[0] += a;
  state[1] += b;
  state[2] += c;
  state[3] += d;
  state[4] += e;
  state[5] += f;
  state[6] += g;
  state[7] += h;
}

}  // namespace

void compress_portable(std::array<uint32_t, 8>& state, const uint8_t* blocks, size_t count) {
  for (size_t i = 0; i < count; ++i) compress_one(state, blocks + 64 * i);
}

#if defined(__x86_64__)
bool cpu_has_sha_extensions() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool sha = (ebx >> 29) & 1;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool ssse3 = (ecx >> 9) & 1, sse41 = (ecx >> 19) & 1;
    return sha && ssse3 && sse41;
  }();
  return has;
}

// The SHA extensions keep the state as two vectors, (A, B, E, F) and (C, D, G, H), high lane
// first; sha256rnds2 runs two rounds from the low two lanes of message + constants, and
// sha256msg1/msg2 extend the message schedule four words at a time.
__attribute__((target("sha,ssse3,sse4.1"))) void compress_sha_extensions(
    std::array<uint32_t, 8>& state, const uint8_t* blocks, size_t count) {
  const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i dcba = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state.data()));
  __m128i hgfe = _mm_loadu_si128(reinterpret_cast<const __m128i*>(state.data() + 4));
  const __m128i badc = _mm_shuffle_epi32(dcba, 0xB1);
  const __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
  __m128i abef = _mm_alignr_epi8(badc, efgh, 8);
  __m128i cdgh = _mm_blend_epi16(efgh, badc, 0xF0);
  for (size_t b = 0; b < count; ++b) {
    const uint8_t* block = blocks + 64 * b;
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w[4];  // the last four groups of four message words
    for (int i = 0; i < 16; ++i) {
      __m128i m;
      if (i < 4) {
        m = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * i)),
                             byte_swap);
      } else {
        // W[t..t+3] = W[t-16..] + s0(W[t-15..]) + W[t-7..] + s1(W[t-2..])
        m = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
        m = _mm_add_epi32(m, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
        m = _mm_sha256msg2_epu32(m, w[(i + 3) & 3]);
      }
      w[i & 3] = m;
      const __m128i wk = _mm_add_epi32(
          m, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRoundConstants.data() + 4 * i)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0E));
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
  dcba = _mm_blend_epi16(feba, dchg, 0xF0);
  hgfe = _mm_alignr_epi8(dchg, feba, 8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state.data()), dcba);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state.data() + 4), hgfe);
}
#else
bool cpu_has_sha_extensions() { return false; }
void compress_sha_extensions(std::array<uint32_t, 8>& state, const uint8_t* blocks, size_t count) {
  compress_portable(state, blocks, count);
}
#endif

}  // namespace sha256_detail

Sha256::Sha256() : state_(kInitialState) {}

void Sha256::compress(const uint8_t* blocks, size_t count) {
  if (sha256_detail::cpu_has_sha_extensions()) {
    sha256_detail::compress_sha_extensions(state_, blocks, count);
  } else {
    sha256_detail::compress_portable(state_, blocks, count);
  }
}

void Sha256::update(std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t left_bytes = data.size();
  total_bytes_ += left_bytes;
  if (buffered_bytes_ > 0) {
    const size_t take_bytes = std::min(left_bytes, buffer_.size() - buffered_bytes_);
    std::memcpy(buffer_.data() + buffered_bytes_, p, take_bytes);
    buffered_bytes_ += take_bytes;
    p += take_bytes;
    left_bytes -= take_bytes;
    if (buffered_bytes_ < buffer_.size()) return;
    compress(buffer_.data(), 1);
    buffered_bytes_ = 0;
  }
  const size_t blocks = left_bytes / 64;
  compress(p, blocks);
  p += 64 * blocks;
  left_bytes -= 64 * blocks;
  if (left_bytes > 0) std::memcpy(buffer_.data(), p, left_bytes);
  buffered_bytes_ = left_bytes;
}

Sha256::Digest Sha256::digest() const {
  // Padding: 0x80, zeros up to 56 mod 64, then the message length in bits, big-endian.
  Sha256 tail = *this;
  const uint64_t length_bits = total_bytes_ * 8;
  const uint8_t one_bit = 0x80;
  tail.update(&one_bit, 1);
  const uint8_t zeros[64] = {};
  const size_t zero_bytes = (tail.buffered_bytes_ <= 56 ? 56 : 120) - tail.buffered_bytes_;
  tail.update(zeros, zero_bytes);
  uint8_t length_be[8];
  for (int i = 0; i < 8; ++i) length_be[i] = static_cast<uint8_t>(length_bits >> (56 - 8 * i));
  tail.update(length_be, 8);

  Digest out;
  for (size_t i = 0; i < 8; ++i) {
    for (size_t k = 0; k < 4; ++k) {
      out[4 * i + k] = static_cast<uint8_t>(tail.state_[i] >> (24 - 8 * k));
    }
  }
  return out;
}

std::string Sha256::hex_digest() const {
  const Digest d = digest();
  return to_hex(d);
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * bytes.size(), '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

std::string sha256_hex(std::span<const std::byte> data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

std::string sha256_file_hex(const std::filesystem::path& path) {
  Sha256 h;
  files::read_in_chunks("sha256", path, [&h](std::span<const std::byte> b) { h.update(b); });
  return h.hex_digest();
}

void sha256_update_u64_le(Sha256& hash, std::span<const uint64_t> values) {
  uint8_t block[8 * 64];
  size_t filled_bytes = 0;
  for (const uint64_t v : values) {
    for (int i = 0; i < 8; ++i) block[filled_bytes++] = static_cast<uint8_t>(v >> (8 * i));
    if (filled_bytes == sizeof(block)) {
      hash.update(block, filled_bytes);
      filled_bytes = 0;
    }
  }
  hash.update(block, filled_bytes);
}

}  // namespace zerodp
