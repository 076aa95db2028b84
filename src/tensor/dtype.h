// Element types and conversions between them.
//
// Storage types are 16-bit patterns with names, so a bf16 buffer cannot be passed where an
// f16 one is expected. Every narrowing conversion rounds to nearest, ties to even; NaN stays
// NaN (quiet), values past the largest finite become Inf, subnormals are kept (never
// flushed). The vector and scalar paths give identical bits; tests check all 65,536
// patterns of each 16-bit type and millions of random f32 values.
//
// Exact rules, shared bit for bit by every path:
// - Finite f32 -> f16/bf16: round to nearest, ties to even, as if the exponent range were
//   unbounded; a result past the largest finite (65504 for f16, about 3.39e38 for bf16)
//   becomes Inf of the same sign, so f16 overflows from 65520 (the tie with 65536) upward.
//   Results below the smallest normal are subnormals or a signed zero, never flushed.
// - f16/bf16 -> f32 is exact for every non-NaN pattern (f32 holds all of them).
// - NaN in, NaN out, always quiet: the sign is kept, the quiet bit (top mantissa bit) is set,
//   and the remaining payload is kept from its top down as far as the result holds it.
//   f32 -> bf16: (bits >> 16) | 0x0040. f32 -> f16: sign | 0x7e00 | ((mantissa >> 13) & 0x1ff).
//   Widening keeps the whole payload and sets the quiet bit, so a signalling 16-bit NaN comes
//   back from a round trip quiet (this is what F16C's vcvtph2ps does; bf16 follows suit).
// - No path reads MXCSR: flush-to-zero, denormals-are-zero and the rounding mode set by a
//   caller change nothing (the vector paths round with an immediate, bf16 in integers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace zerodp {

// kU8: raw bytes (a quantized payload, comm/quantize.h), which collectives move but never
// reduce, and nothing converts.
enum class DType : uint8_t { kF32, kF16, kBF16, kU8 };

struct BFloat16 {
  uint16_t bits = 0;
  bool operator==(const BFloat16&) const = default;
};
struct Float16 {
  uint16_t bits = 0;
  bool operator==(const Float16&) const = default;
};

constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : t == DType::kU8 ? 1 : 2; }
std::string_view dtype_name(DType t);  // "f32", "f16", "bf16", "u8"
// Takes dtype_name()'s names and the aliases "fp32", "float32", "fp16", "float16" and
// "bfloat16" (lower case only); nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view name);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<Float16>() {
  return DType::kF16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::kBF16;
}

// Scalar conversions: the reference semantics for everything below.
float to_f32(BFloat16 x);
float to_f32(Float16 x);
BFloat16 to_bf16(float x);
Float16 to_f16(float x);

// Bulk conversions; `in` and `out` have equal lengths (InvalidArgument otherwise). They use
// AVX-512 / F16C where the CPU has them, chosen once at run time, and fall back to the
// scalar code elsewhere.
void convert(std::span<const float> in, std::span<BFloat16> out);
void convert(std::span<const float> in, std::span<Float16> out);
void convert(std::span<const BFloat16> in, std::span<float> out);
void convert(std::span<const Float16> in, std::span<float> out);

// The portable paths, exposed so tests can compare them with the vector ones bit for bit.
namespace scalar {
void convert(std::span<const float> in, std::span<BFloat16> out);
void convert(std::span<const float> in, std::span<Float16> out);
void convert(std::span<const BFloat16> in, std::span<float> out);
void convert(std::span<const Float16> in, std::span<float> out);
}  // namespace scalar

// Which bulk path convert() uses on this CPU: "avx512", "f16c" or "scalar".
std::string_view conversion_path();

// One implementation of the bulk conversions. Each function checks that the lengths match
// (InvalidArgument otherwise), like convert(), and gives the same bits as scalar::convert.
struct ConversionKernels {
  std::string_view name;  // "avx512", "f16c" or "scalar"
  void (*f32_to_bf16)(std::span<const float> in, std::span<BFloat16> out);
  void (*f32_to_f16)(std::span<const float> in, std::span<Float16> out);
  void (*bf16_to_f32)(std::span<const BFloat16> in, std::span<float> out);
  void (*f16_to_f32)(std::span<const Float16> in, std::span<float> out);
};

// Every path this CPU can run, fastest first; the last is always "scalar" and the first is
// the one convert() uses. Tests and benchmarks run each against the scalar one.
std::span<const ConversionKernels> conversion_kernels();

}  // namespace zerodp
