// Block quantization kernels: widen a tile to fp32, one pass per block for amax, one to code.
//
// The inner loops are plain element-wise loops (and an integer max), written so the compiler
// vectorizes them; none reassociates floating-point arithmetic, so every vector width gives
// the same bits as the scalar loop.
#include "comm/quantize.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace zerodp {
namespace {

// Elements widened or decoded at a time: small enough for the stack and L1.
constexpr size_t kTile = 4096;
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;  // |x| bits at or above this: Inf or NaN

size_t block_count(size_t count, size_t block) { return count / block + (count % block != 0); }

size_t value_bytes(size_t count, QuantBits bits) {
  return bits == QuantBits::kInt4 ? count / 2 + (count & 1) : count;
}

// The element loops below are written once, inlined into kernels that the compiler builds for
// several x86 levels (chosen once at load time through an ifunc): SSE2 alone turns out 3-5x
// slower. Every operation in them is an IEEE fp32 operation on one element, a truncating
// conversion or an integer max, so each level gives the same bits.
// Not under ThreadSanitizer, whose runtime may not be set up yet when ifunc resolvers run.
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__SANITIZE_THREAD__)
#define ZERODP_QUANT_KERNEL \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define ZERODP_QUANT_KERNEL
#endif

// The largest |x| as bits: for non-negative floats the integer order of the bits is the
// numeric order, with Inf above every finite value and NaN above Inf, so one integer max
// finds amax and any non-finite value exactly, whatever order the lanes combine in.
[[gnu::always_inline]] inline uint32_t abs_max_bits(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
    m = b > m ? b : m;
  }
  return m;
}

[[gnu::always_inline]] inline float scale_of(uint32_t amax_bits, int qmax) {
  if (amax_bits >= kInfBits) return std::numeric_limits<float>::quiet_NaN();
  return std::bit_cast<float>(amax_bits) / static_cast<float>(qmax);
}

// codes[i] = x[i] / scale rounded to nearest even, clamped to [-qmax, qmax]. The rounding is
// done from the truncated value (cvttps2dq ignores the rounding mode), so a caller's
// fesetround cannot change the codes. A zero scale (all-zero block, or amax so small that
// amax / qmax underflows) and a NaN scale give codes 0.
[[gnu::always_inline]] inline void code_elements(const float* x, size_t n, float scale,
                                                 int qmax_int, int8_t* codes) {
  if (!(scale > 0)) {
    std::memset(codes, 0, n);
    return;
  }
  const auto qmax = static_cast<float>(qmax_int);
  for (size_t i = 0; i < n; ++i) {
    float y = x[i] / scale;
    // Clamping first keeps the conversion in range; |x| <= amax makes y at most qmax plus the
    // division's rounding, and the order of the two selects maps nothing to NaN.
    y = y < qmax ? y : qmax;
    y = y > -qmax ? y : -qmax;
    const auto t = static_cast<int32_t>(y);        // toward zero
    const float frac = y - static_cast<float>(t);  // exact: |y| <= 127
    const int32_t odd = t & 1;
    const int32_t up =
        static_cast<int32_t>(frac > 0.5f) | (static_cast<int32_t>(frac == 0.5f) & odd);
    const int32_t down =
        static_cast<int32_t>(frac < -0.5f) | (static_cast<int32_t>(frac == -0.5f) & odd);
    codes[i] = static_cast<int8_t>(t + up - down);
  }
}

void store_scale(std::byte* scales, size_t k, float scale) {
  std::memcpy(scales + k * sizeof(float), &scale, sizeof(float));
}

float load_scale(const std::byte* scales, size_t k) {
  float s;
  std::memcpy(&s, scales + k * sizeof(float), sizeof(float));
  return s;
}

ZERODP_QUANT_KERNEL void widen_bf16(const BFloat16* h, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i)
    out[i] = std::bit_cast<float>(static_cast<uint32_t>(h[i].bits) << 16);
}

ZERODP_QUANT_KERNEL uint32_t abs_max_chunk(const float* x, size_t n) { return abs_max_bits(x, n); }

ZERODP_QUANT_KERNEL void quantize_chunk(const float* x, size_t n, float scale, int qmax,
                                        int8_t* codes) {
  code_elements(x, n, scale, qmax, codes);
}

// `n` elements that start on a block boundary: their scales (block by block from `scales`)
// and codes.
ZERODP_QUANT_KERNEL void quantize_blocks(const float* x, size_t n, size_t block, int qmax,
                                         std::byte* scales, int8_t* codes) {
  for (size_t off = 0, k = 0; off < n; off += block, ++k) {
    const size_t len = std::min(block, n - off);
    const float scale = scale_of(abs_max_bits(x + off, len), qmax);
    store_scale(scales, k, scale);
    code_elements(x + off, len, scale, qmax, codes + off);
  }
}

// Writes codes for elements [start, start + n) into the int4 values. Bytes are written in
// increasing order, so an odd `start` completes the byte whose low nibble the previous call
// wrote.
ZERODP_QUANT_KERNEL void pack_int4(const int8_t* codes, size_t n, size_t start, uint8_t* values) {
  if (n == 0) return;
  size_t i = 0;
  if (start & 1) {
    uint8_t& b = values[start / 2];
    b = static_cast<uint8_t>((b & 0x0fu) | ((static_cast<unsigned>(codes[0]) & 0x0fu) << 4));
    i = 1;
  }
  uint8_t* out = values + (start + i) / 2;
  const int8_t* c = codes + i;
  const size_t pairs = (n - i) / 2;
  for (size_t p = 0; p < pairs; ++p) {
    out[p] = static_cast<uint8_t>((static_cast<unsigned>(c[2 * p]) & 0x0fu) |
                                  ((static_cast<unsigned>(c[2 * p + 1]) & 0x0fu) << 4));
  }
  if ((n - i) & 1) out[pairs] = static_cast<uint8_t>(static_cast<unsigned>(c[2 * pairs]) & 0x0fu);
}

// Decodes elements [start, start + n) of the int4 values; `start` is even.
ZERODP_QUANT_KERNEL void unpack_int4(const uint8_t* values, size_t start, size_t n, int8_t* codes) {
  const uint8_t* in = values + start / 2;
  const size_t pairs = n / 2;
  for (size_t p = 0; p < pairs; ++p) {
    // Shifting the nibble to the top of a byte and back arithmetically sign-extends it.
    codes[2 * p] = static_cast<int8_t>(static_cast<int8_t>(in[p] << 4) >> 4);
    codes[2 * p + 1] = static_cast<int8_t>(static_cast<int8_t>(in[p]) >> 4);
  }
  if (n & 1) codes[n - 1] = static_cast<int8_t>(static_cast<int8_t>(in[pairs] << 4) >> 4);
}

// out[i] = (or +=) codes[i] * scale of its block, for the `n` elements from element `start`.
template <bool kAdd>
[[gnu::always_inline]] inline void dequantize_codes(const int8_t* codes, size_t start, size_t n,
                                                    size_t block, const std::byte* scales,
                                                    float* out) {
  for (size_t s = 0; s < n;) {
    const size_t k = (start + s) / block;
    const size_t end = std::min(n, (k + 1) * block - start);
    const float scale = load_scale(scales, k);
    for (size_t i = s; i < end; ++i) {
      const float y = static_cast<float>(codes[i]) * scale;
      if constexpr (kAdd) {
        out[i] += y;
      } else {
        out[i] = y;
      }
    }
    s = end;
  }
}

ZERODP_QUANT_KERNEL void dequantize_set(const int8_t* codes, size_t start, size_t n, size_t block,
                                        const std::byte* scales, float* out) {
  dequantize_codes<false>(codes, start, n, block, scales, out);
}

ZERODP_QUANT_KERNEL void dequantize_accumulate(const int8_t* codes, size_t start, size_t n,
                                               size_t block, const std::byte* scales, float* out) {
  dequantize_codes<true>(codes, start, n, block, scales, out);
}

// Elements [start, start + n) of `in` as fp32: the input itself for f32, otherwise widened
// (exactly) into `scratch`.
const float* widen(ConstBuffer in, size_t start, size_t n, float* scratch) {
  switch (in.dtype) {
    case DType::kF32:
      return static_cast<const float*>(in.data) + start;
    case DType::kBF16:
      // A plain shift rather than convert(): it leaves NaN payloads unquieted, which only
      // NaN blocks see, and their values are never used.
      widen_bf16(static_cast<const BFloat16*>(in.data) + start, n, scratch);
      return scratch;
    case DType::kF16:
      convert(std::span<const Float16>(static_cast<const Float16*>(in.data) + start, n),
              std::span<float>(scratch, n));
      return scratch;
    case DType::kU8:
      break;
  }
  throw InvalidArgument(
      fmt::format("quantize: dtype {} is not f32, f16 or bf16", static_cast<int>(in.dtype)));
}

void check_packed_size(std::string_view what, size_t have, size_t count, BlockQuant q) {
  const size_t want = quantized_bytes(count, q);
  if (have != want) {
    throw InvalidArgument(fmt::format(
        "{}: packed buffer holds {} bytes but {} elements in int{} blocks of {} take {} bytes; "
        "size it with quantized_bytes()",
        what, have, count, static_cast<int>(q.bits), q.block, want));
  }
}

// Calls `tile(start, n, codes)` for the packed values in tiles of at most kTile elements, with
// `codes` the tile's int8 codes. Tiles start at multiples of kTile, so int4 tiles start on a
// byte.
template <typename Tile>
void for_each_tile(std::span<const std::byte> in, size_t count, BlockQuant q, Tile tile) {
  const auto* values =
      reinterpret_cast<const uint8_t*>(in.data() + block_count(count, q.block) * sizeof(float));
  std::array<int8_t, kTile> scratch;
  for (size_t t0 = 0; t0 < count; t0 += kTile) {
    const size_t n = std::min(kTile, count - t0);
    if (q.bits == QuantBits::kInt8) {
      tile(t0, n, reinterpret_cast<const int8_t*>(values) + t0);
    } else {
      unpack_int4(values, t0, n, scratch.data());
      tile(t0, n, scratch.data());
    }
  }
}

}  // namespace

BlockQuant qgz_quant(const CommOptions& options) {
  return BlockQuant{.bits = options.qgz_bits == 4 ? QuantBits::kInt4 : QuantBits::kInt8,
                    .block = options.qgz_block};
}

void check_block_quant(BlockQuant q) {
  if (q.bits != QuantBits::kInt8 && q.bits != QuantBits::kInt4) {
    throw InvalidArgument(
        fmt::format("block quantization: {} bits is not supported; use 8 (int8) or 4 (int4)",
                    static_cast<int>(q.bits)));
  }
  if (q.block == 0) {
    throw InvalidArgument(
        "block quantization: block 0 elements per scale; a block holds at least 1 element "
        "(256 is the default)");
  }
}

size_t quantized_bytes(size_t count, BlockQuant q) {
  check_block_quant(q);
  const size_t scales = block_count(count, q.block);
  const size_t values = value_bytes(count, q.bits);
  if (scales > (std::numeric_limits<size_t>::max() - values) / sizeof(float)) {
    throw InvalidArgument(fmt::format(
        "block quantization: {} elements in blocks of {} take more bytes than size_t holds", count,
        q.block));
  }
  return scales * sizeof(float) + values;
}

void quantize(ConstBuffer in, std::span<std::byte> out, BlockQuant q) {
  check_packed_size(fmt::format("quantize {} elements of {}", in.count, dtype_name(in.dtype)),
                    out.size(), in.count, q);
  const size_t count = in.count;
  const int qmax = quant_max(q.bits);
  std::byte* scales = out.data();
  auto* values =
      reinterpret_cast<uint8_t*>(out.data() + block_count(count, q.block) * sizeof(float));
  std::array<float, kTile> wide;
  std::array<int8_t, kTile> codes;
  // Where the codes of elements from `start` go: straight into the output for int8, through
  // `codes` and pack_int4 for int4.
  auto code_dst = [&](size_t start) {
    return q.bits == QuantBits::kInt8 ? reinterpret_cast<int8_t*>(values) + start : codes.data();
  };

  if (q.block <= kTile) {
    // Whole blocks per tile: each element is widened once.
    const size_t group = kTile / q.block * q.block;
    for (size_t g0 = 0; g0 < count; g0 += group) {
      const size_t n = std::min(group, count - g0);
      quantize_blocks(widen(in, g0, n, wide.data()), n, q.block, qmax,
                      scales + g0 / q.block * sizeof(float), code_dst(g0));
      if (q.bits == QuantBits::kInt4) pack_int4(codes.data(), n, g0, values);
    }
    return;
  }
  // Blocks larger than a tile: one pass for amax, one to code, each widening its chunk.
  for (size_t b0 = 0; b0 < count; b0 += q.block) {
    const size_t len = std::min(q.block, count - b0);
    uint32_t amax = 0;
    for (size_t c = 0; c < len; c += kTile) {
      const size_t n = std::min(kTile, len - c);
      amax = std::max(amax, abs_max_chunk(widen(in, b0 + c, n, wide.data()), n));
    }
    const float scale = scale_of(amax, qmax);
    store_scale(scales, b0 / q.block, scale);
    for (size_t c = 0; c < len; c += kTile) {
      const size_t n = std::min(kTile, len - c);
      quantize_chunk(widen(in, b0 + c, n, wide.data()), n, scale, qmax, code_dst(b0 + c));
      if (q.bits == QuantBits::kInt4) pack_int4(codes.data(), n, b0 + c, values);
    }
  }
}

void dequantize(std::span<const std::byte> in, MutableBuffer out, BlockQuant q) {
  check_packed_size(fmt::format("dequantize {} elements of {}", out.count, dtype_name(out.dtype)),
                    in.size(), out.count, q);
  if (out.dtype == DType::kF32) {
    auto* y = static_cast<float*>(out.data);
    for_each_tile(in, out.count, q, [&](size_t t0, size_t n, const int8_t* codes) {
      dequantize_set(codes, t0, n, q.block, in.data(), y + t0);
    });
    return;
  }
  // 16-bit outputs: a tile in fp32, then one rounding per element by convert().
  std::array<float, kTile> wide;
  for_each_tile(in, out.count, q, [&](size_t t0, size_t n, const int8_t* codes) {
    dequantize_set(codes, t0, n, q.block, in.data(), wide.data());
    const std::span<const float> tile(wide.data(), n);
    if (out.dtype == DType::kBF16) {
      convert(tile, std::span<BFloat16>(static_cast<BFloat16*>(out.data) + t0, n));
    } else {
      convert(tile, std::span<Float16>(static_cast<Float16*>(out.data) + t0, n));
    }
  });
}

void dequantize_add(std::span<const std::byte> in, std::span<float> acc, BlockQuant q) {
  check_packed_size(fmt::format("dequantize_add into {} fp32 elements", acc.size()), in.size(),
                    acc.size(), q);
  for_each_tile(in, acc.size(), q, [&](size_t t0, size_t n, const int8_t* codes) {
    dequantize_accumulate(codes, t0, n, q.block, in.data(), acc.data() + t0);
  });
}

float abs_max(std::span<const float> x) {
  const uint32_t bits = abs_max_chunk(x.data(), x.size());
  return bits >= kInfBits ? std::numeric_limits<float>::infinity() : std::bit_cast<float>(bits);
}

float block_scale(float amax, QuantBits bits) {
  return scale_of(std::bit_cast<uint32_t>(amax) & kAbsMask, quant_max(bits));
}

void quantize_codes(std::span<const float> x, float scale, QuantBits bits,
                    std::span<int8_t> codes) {
  if (codes.size() != x.size()) {
    throw InvalidArgument(fmt::format("quantize_codes: {} codes for {} elements; give one each",
                                      codes.size(), x.size()));
  }
  quantize_chunk(x.data(), x.size(), scale, quant_max(bits), codes.data());
}

size_t code_bytes(size_t count, QuantBits bits) { return value_bytes(count, bits); }

void pack_codes(std::span<const int8_t> codes, QuantBits bits, std::span<std::byte> out) {
  if (out.size() != value_bytes(codes.size(), bits)) {
    throw InvalidArgument(
        fmt::format("pack_codes: {} bytes for {} int{} codes; size it with code_bytes()",
                    out.size(), codes.size(), static_cast<int>(bits)));
  }
  if (bits == QuantBits::kInt8) {
    std::memcpy(out.data(), codes.data(), codes.size());
    return;
  }
  pack_int4(codes.data(), codes.size(), 0, reinterpret_cast<uint8_t*>(out.data()));
}

void unpack_codes(std::span<const std::byte> in, QuantBits bits, std::span<int8_t> codes) {
  if (in.size() != value_bytes(codes.size(), bits)) {
    throw InvalidArgument(
        fmt::format("unpack_codes: {} bytes for {} int{} codes; size it with code_bytes()",
                    in.size(), codes.size(), static_cast<int>(bits)));
  }
  if (bits == QuantBits::kInt8) {
    std::memcpy(codes.data(), in.data(), codes.size());
    return;
  }
  unpack_int4(reinterpret_cast<const uint8_t*>(in.data()), 0, codes.size(), codes.data());
}

}  // namespace zerodp
