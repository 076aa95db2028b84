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

// Each element is read as an fp32 value m * 2^(e - 150): its square is m2 * 2^(2e - 300), m2 =
// m^2 below 2^48. Decoders write a block of (slot, m2): the slot is e, except that fp32
// subnormals (e = 1, no hidden bit) go to slot 0 so that decoding needs no max(); non-finite
// elements go to slot 255, with m2 = 2^46 exactly for Inf (larger for NaN). Loops of plain
// integer operations over a block, so the compiler vectorizes them; memcpy is a plain load
// that does not alias the caller's element type.
constexpr uint32_t kNonFiniteSlot = 255;
constexpr uint64_t kInfSquare = uint64_t{1} << 46;

inline uint32_t slot_exponent(uint32_t slot) { return std::max(slot, 1u); }

struct DecodeF32 {
  static constexpr size_t kBytes = 4;
  static void decode(const std::byte* p, size_t n, uint32_t* slot, uint64_t* m2) {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + 4 * i, 4);
      const uint32_t e = (bits >> 23) & 0xffu;
      const uint32_t m = (bits & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
      slot[i] = e;
      m2[i] = uint64_t{m} * m;
    }
  }
};

// A bf16 is the top half of an fp32.
struct DecodeBF16 {
  static constexpr size_t kBytes = 2;
  static void decode(const std::byte* p, size_t n, uint32_t* slot, uint64_t* m2) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, p + 2 * i, 2);
      const uint32_t e = (bits >> 7) & 0xffu;
      const uint32_t m = ((bits & 0x7fu) | (e != 0 ? 0x80u : 0u)) << 16;
      slot[i] = e;
      m2[i] = uint64_t{m} * m;
    }
  }
};

// An f16 x = m * 2^(max(e, 1) - 25), m of 11 bits. As an fp32 value the same x is
// (m << 13) * 2^(e' - 150) with e' = max(e, 1) + 112, so its square is (m^2 << 26) in slot e'.
// Subnormal f16 values widen to normal fp32 values with another (e', m), but the same x^2:
// the bins differ, the exact total does not.
struct DecodeF16 {
  static constexpr size_t kBytes = 2;
  static void decode(const std::byte* p, size_t n, uint32_t* slot, uint64_t* m2) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, p + 2 * i, 2);
      const uint32_t e = (bits >> 10) & 0x1fu;
      const uint32_t m = (bits & 0x3ffu) | (e != 0 ? 0x400u : 0u);
      // max(e, 1) + 112, and 255 for e = 31, in operations SSE2 has.
      slot[i] = e + 112 + (e == 0 ? 1u : 0u) + (e == 31 ? kNonFiniteSlot - 143 : 0u);
      m2[i] = (uint64_t{m} * m) << 26;
    }
  }
};

using Bins = std::array<U128, 256>;  // Bins[slot]: Σ m2 over the elements of that slot

// Squares go to kTables tables of uint64 in turn, so consecutive elements of one exponent do
// not wait on each other's store; each table takes at most 2^16 squares below 2^48 before it is
// flushed into the 128-bit bins, so it cannot overflow. Elements are decoded kBlock at a time.
constexpr size_t kTables = 4;
constexpr size_t kChunk = kTables << 16;
constexpr size_t kBlock = 256;
static_assert(kChunk % kBlock == 0 && kBlock % kTables == 0);

// Adds the squares of x[0, n) to `bins`; returns the non-finite state of x.
template <typename Decode>
uint8_t accumulate(const std::byte* x, size_t n, Bins& bins) {
  alignas(64) uint64_t table[kTables][256];
  alignas(64) uint32_t slot[kBlock];
  alignas(64) uint64_t m2[kBlock];
  uint8_t state = kAllFinite;
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t end = std::min(n, begin + kChunk);
    std::memset(table, 0, sizeof table);
    for (size_t block = begin; block < end; block += kBlock) {
      const size_t count = std::min(kBlock, end - block);
      Decode::decode(x + block * Decode::kBytes, count, slot, m2);
      size_t i = 0;
      for (; i + kTables <= count; i += kTables) {
        for (size_t t = 0; t < kTables; ++t) table[t][slot[i + t]] += m2[i + t];
      }
      // Only the last block of a chunk is short, so table t still takes element t mod kTables.
      for (; i < count; ++i) table[i % kTables][slot[i]] += m2[i];
    }
    uint64_t non_finite = 0;
    for (size_t t = 0; t < kTables; ++t) {
      for (size_t e = 0; e < kNonFiniteSlot; ++e) bins[e] += table[t][e];
      non_finite |= table[t][kNonFiniteSlot];
    }
    // Rare: tell NaN from Inf only for a chunk that holds either.
    if (non_finite != 0) {
      state = std::max(state, kSawInf);
      for (size_t block = begin; block < end; block += kBlock) {
        const size_t count = std::min(kBlock, end - block);
        Decode::decode(x + block * Decode::kBytes, count, slot, m2);
        for (size_t i = 0; i < count; ++i) {
          if (slot[i] == kNonFiniteSlot && m2[i] != kInfSquare) state = kSawNaN;
        }
      }
    }
  }
  return state;
}

// limbs += Σ bins[slot] * 2^(2e - 2), in units of 2^-298 (2e - 300 + 298). Each limb takes at
// most two 32-bit addends per bin, so the uint64 limbs cannot overflow before normalizing.
void fold(const Bins& bins, std::array<uint64_t, SquareSum::kLimbs>& limbs) {
  for (uint32_t slot = 0; slot < kNonFiniteSlot; ++slot) {
    const U128 b = bins[slot];
    if (b == 0) continue;
    const uint32_t shift = 2 * slot_exponent(slot) - 2;
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
uint8_t add_to(std::array<uint64_t, SquareSum::kLimbs>& limbs, const void* x, size_t n) {
  if (n == 0) return kAllFinite;
  Bins bins{};
  const uint8_t state = accumulate<Decode>(static_cast<const std::byte*>(x), n, bins);
  fold(bins, limbs);
  normalize(limbs);
  return state;
}

}  // namespace

void SquareSum::add(std::span<const float> x) {
  nonfinite_ = std::max(nonfinite_, add_to<DecodeF32>(limbs_, x.data(), x.size()));
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
      state = add_to<DecodeF32>(limbs_, bytes, count);
      break;
    case DType::kF16:
      state = add_to<DecodeF16>(limbs_, bytes, count);
      break;
    case DType::kBF16:
      state = add_to<DecodeBF16>(limbs_, bytes, count);
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
