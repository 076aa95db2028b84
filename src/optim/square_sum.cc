#include "optim/square_sum.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {
namespace {

__extension__ typedef unsigned __int128 U128;

constexpr uint8_t kAllFinite = 0;
constexpr uint8_t kSawInf = 1;
constexpr uint8_t kSawNaN = 2;

// One element as an fp32 value m * 2^(e - 150), so x^2 = m2 * 2^(2e - 300) with m2 = m^2 below
// 2^48. Non-finite elements get e = 255, and m2 = 2^46 exactly for Inf (larger for NaN).
struct Decoded {
  uint32_t e;
  uint64_t m2;
};
constexpr uint32_t kNonFiniteSlot = 255;
constexpr uint64_t kInfSquare = uint64_t{1} << 46;

inline Decoded decode_f32_bits(uint32_t bits) {
  const uint32_t biased = (bits >> 23) & 0xff;
  const uint32_t m = (bits & 0x7fffff) | (uint32_t{biased != 0} << 23);
  // Subnormals share the exponent of the smallest normal, without the hidden bit.
  return {biased + uint32_t{biased == 0}, uint64_t{m} * m};
}

// Each decoder reads element i of a byte buffer (memcpy: a plain load, without aliasing the
// caller's element type).
struct DecodeF32 {
  Decoded operator()(const std::byte* p, size_t i) const {
    uint32_t bits;
    std::memcpy(&bits, p + 4 * i, 4);
    return decode_f32_bits(bits);
  }
};

// A bf16 is the top half of an fp32.
struct DecodeBF16 {
  Decoded operator()(const std::byte* p, size_t i) const {
    uint16_t bits;
    std::memcpy(&bits, p + 2 * i, 2);
    return decode_f32_bits(uint32_t{bits} << 16);
  }
};

// An f16 x = m * 2^(max(e, 1) - 25), m of 11 bits. As an fp32 value the same x is
// (m << 13) * 2^(e' - 150) with e' = max(e, 1) + 112, so its square is (m^2 << 26) in slot e'.
// Subnormal f16 values widen to normal fp32 values with another (e', m), but the same x^2:
// the bins differ, the exact total does not.
struct DecodeF16 {
  Decoded operator()(const std::byte* p, size_t i) const {
    uint16_t bits;
    std::memcpy(&bits, p + 2 * i, 2);
    const uint32_t biased = (bits >> 10) & 0x1fu;
    const uint32_t m = (bits & 0x3ffu) | (uint32_t{biased != 0} << 10);
    const uint32_t e = biased == 31 ? kNonFiniteSlot : biased + uint32_t{biased == 0} + 112;
    return {e, (uint64_t{m} * m) << 26};
  }
};

using Bins = std::array<U128, 256>;  // Bins[e]: Σ m2 over the elements of slot e

// Squares go to kTables tables of uint64 in turn, so consecutive elements of one exponent do
// not wait on each other's store; each table takes at most 2^16 squares below 2^48 before it is
// flushed into the 128-bit bins, so it cannot overflow.
constexpr size_t kTables = 4;
constexpr size_t kChunk = kTables << 16;

// Adds the squares of x[0, n) to `bins`; returns the non-finite state of x.
template <typename Decode>
uint8_t accumulate(const std::byte* x, size_t n, Decode decode, Bins& bins) {
  alignas(64) uint64_t table[kTables][256];
  uint8_t state = kAllFinite;
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t end = std::min(n, begin + kChunk);
    std::memset(table, 0, sizeof table);
    size_t i = begin;
    for (; i + kTables <= end; i += kTables) {
      for (size_t t = 0; t < kTables; ++t) {
        const Decoded d = decode(x, i + t);
        table[t][d.e] += d.m2;
      }
    }
    for (; i < end; ++i) {
      const Decoded d = decode(x, i);
      table[(i - begin) % kTables][d.e] += d.m2;
    }
    uint64_t non_finite = 0;
    for (size_t t = 0; t < kTables; ++t) {
      for (size_t e = 0; e < kNonFiniteSlot; ++e) bins[e] += table[t][e];
      non_finite |= table[t][kNonFiniteSlot];
    }
    // Rare: tell NaN from Inf only for a chunk that holds either.
    if (non_finite != 0) {
      state = std::max(state, kSawInf);
      for (size_t k = begin; k < end; ++k) {
        const Decoded d = decode(x, k);
        if (d.e == kNonFiniteSlot && d.m2 != kInfSquare) state = kSawNaN;
      }
    }
  }
  return state;
}

// limbs += Σ_e bins[e] * 2^(2e - 2), in units of 2^-298 (2e - 300 + 298). Each limb takes at
// most two 32-bit addends per bin, so the uint64 limbs cannot overflow before normalizing.
void fold(const Bins& bins, std::array<uint64_t, SquareSum::kLimbs>& limbs) {
  for (uint32_t e = 1; e < kNonFiniteSlot; ++e) {
    const U128 b = bins[e];
    if (b == 0) continue;
    const uint32_t shift = 2 * e - 2;
    const size_t limb = shift / 32;  // at most 15: the four words below reach limb 19
    for (size_t j = 0; j < 4; ++j) {
      const uint64_t word = static_cast<uint32_t>(b >> (32 * j));
      const uint64_t shifted = word << (shift % 32);
      limbs[limb + j] += shifted & 0xffffffffu;
      limbs[limb + j + 1] += shifted >> 32;
    }
  }
}

void normalize(std::array<uint64_t, SquareSum::kLimbs>& limbs) {
  uint64_t carry = 0;
  for (size_t i = 0; i + 1 < limbs.size(); ++i) {
    const uint64_t v = limbs[i] + carry;
    limbs[i] = v & 0xffffffffu;
    carry = v >> 32;
  }
  // Past the capacity in the header's contract only; kept exact while it fits 64 bits.
  limbs.back() += carry;
}

template <typename Decode>
uint8_t add_to(std::array<uint64_t, SquareSum::kLimbs>& limbs, const void* x, size_t n,
               Decode decode) {
  Bins bins{};
  const uint8_t state = accumulate(static_cast<const std::byte*>(x), n, decode, bins);
  fold(bins, limbs);
  normalize(limbs);
  return state;
}

}  // namespace

void SquareSum::add(std::span<const float> x) {
  nonfinite_ = std::max(nonfinite_, add_to(limbs_, x.data(), x.size(), DecodeF32{}));
}

void SquareSum::add(const void* data, DType dtype, size_t first, size_t count) {
  if (count == 0) return;
  if (data == nullptr) {
    throw InvalidArgument(fmt::format(
        "square sum: buffer is null but {} elements from {} were asked for; pass the buffer", count,
        first));
  }
  const auto* bytes = static_cast<const std::byte*>(data) + first * dtype_size(dtype);
  uint8_t state = kAllFinite;
  switch (dtype) {
    case DType::kF32:
      state = add_to(limbs_, bytes, count, DecodeF32{});
      break;
    case DType::kF16:
      state = add_to(limbs_, bytes, count, DecodeF16{});
      break;
    case DType::kBF16:
      state = add_to(limbs_, bytes, count, DecodeBF16{});
      break;
    default:
      throw InvalidArgument(fmt::format("square sum: dtype code {} is not one of f32, f16, bf16",
                                        static_cast<int>(dtype)));
  }
  nonfinite_ = std::max(nonfinite_, state);
}

void SquareSum::merge(const SquareSum& other) {
  for (size_t i = 0; i < kLimbs; ++i) limbs_[i] += other.limbs_[i];
  normalize(limbs_);
  nonfinite_ = std::max(nonfinite_, other.nonfinite_);
}

double SquareSum::value() const {
  if (nonfinite_ == kSawNaN) return std::numeric_limits<double>::quiet_NaN();
  if (nonfinite_ == kSawInf) return std::numeric_limits<double>::infinity();
  size_t top = kLimbs;
  while (top > 0 && limbs_[top - 1] == 0) --top;
  if (top == 0) return 0.0;
  --top;
  // The top three limbs (below 2^96 when normalized), the rest only as a sticky bit.
  U128 window = (U128{limbs_[top]} << 64) | (U128{top >= 1 ? limbs_[top - 1] : 0} << 32) |
                U128{top >= 2 ? limbs_[top - 2] : 0};
  bool sticky = false;
  for (size_t i = 0; i + 2 < top; ++i) sticky |= limbs_[i] != 0;
  int exponent = 32 * (static_cast<int>(top) - 2) - 298;  // the window's unit is 2^exponent
  const int width =
      128 - (window >> 64 != 0 ? std::countl_zero(static_cast<uint64_t>(window >> 64))
                               : 64 + std::countl_zero(static_cast<uint64_t>(window)));
  // Round to 53 bits by hand, ties to even, so the result does not depend on the rounding mode.
  if (width > 53) {
    const int drop = width - 53;
    const U128 rest = window & ((U128{1} << drop) - 1);
    const U128 half = U128{1} << (drop - 1);
    window >>= drop;
    exponent += drop;
    if (rest > half || (rest == half && (sticky || (window & 1) != 0))) ++window;
  }
  // window <= 2^53 is exact in a double; ldexp is exact unless the result passes the largest
  // double, which it cannot here (at most about 2^342), and then gives +inf.
  return std::ldexp(static_cast<double>(static_cast<uint64_t>(window)), exponent);
}

std::vector<double> SquareSum::to_doubles() const {
  std::vector<double> out(kExchangeDoubles);
  for (size_t i = 0; i < kLimbs; ++i) out[i] = static_cast<double>(limbs_[i]);
  out[kLimbs] = nonfinite_;
  return out;
}

SquareSum SquareSum::from_doubles(std::span<const double> d) {
  if (d.size() != kExchangeDoubles) {
    throw InvalidArgument(fmt::format(
        "square sum: exchange holds {} doubles; a SquareSum is sent as {} (to_doubles())", d.size(),
        kExchangeDoubles));
  }
  SquareSum s;
  for (size_t i = 0; i < kLimbs; ++i) {
    if (!(d[i] >= 0 && d[i] < 0x1p32 && d[i] == std::floor(d[i]))) {
      throw InvalidArgument(fmt::format(
          "square sum: exchange slot {} holds {}; limbs are integers in [0, 2^32)", i, d[i]));
    }
    s.limbs_[i] = static_cast<uint64_t>(d[i]);
  }
  const double state = d[kLimbs];
  if (state != kAllFinite && state != kSawInf && state != kSawNaN) {
    throw InvalidArgument(
        fmt::format("square sum: exchange slot {} (non-finite state) holds {}; it is 0, 1 or 2",
                    kLimbs, state));
  }
  s.nonfinite_ = static_cast<uint8_t>(state);
  return s;
}

}  // namespace zerodp
