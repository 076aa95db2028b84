// Element types and conversions: every path against an independent reference.
//
// The reference narrowing knows nothing of bit tricks: it lists every finite value of the
// 16-bit format as a double, finds the two neighbours of the input, and picks the nearer (ties
// to the even pattern), treating 2^(emax+1) as the neighbour past the largest finite, which
// stands for Inf. Each test runs all paths this CPU has (conversion_kernels()), so the vector
// paths are checked on machines that have them and the scalar one everywhere.
#include "tensor/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define ZERODP_TEST_X86 1
#else
#define ZERODP_TEST_X86 0
#endif

namespace zerodp {
namespace {

constexpr uint32_t kF32Quiet = 0x00400000u;

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }
uint32_t bits_of(BFloat16 x) { return x.bits; }
uint32_t bits_of(Float16 x) { return x.bits; }
float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }

// A binary16-like layout: 1 sign bit, then exponent, then `mantissa_bits`.
struct Format16 {
  int mantissa_bits;
  int exponent_bias;
  uint16_t inf_bits;  // exponent all ones, mantissa 0
  uint16_t exponent_max() const { return static_cast<uint16_t>(inf_bits >> mantissa_bits); }
  uint16_t quiet_bit() const { return static_cast<uint16_t>(1u << (mantissa_bits - 1)); }
};
constexpr Format16 kF16Format{10, 15, 0x7c00};
constexpr Format16 kBf16Format{7, 127, 0x7f80};

// The value of a non-negative pattern from its fields; inf_bits decodes to 2^(emax+1-bias),
// the rounding neighbour just past the largest finite.
double decode(const Format16& f, uint32_t pattern) {
  const uint32_t e = pattern >> f.mantissa_bits;
  const uint32_t m = pattern & ((1u << f.mantissa_bits) - 1u);
  const int scale = f.exponent_bias + f.mantissa_bits;
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - scale);
  return std::ldexp(static_cast<double>((1u << f.mantissa_bits) + m), static_cast<int>(e) - scale);
}

// decode() of 0 .. inf_bits, ascending.
const std::vector<double>& value_table(const Format16& f) {
  static const auto build = [](const Format16& g) {
    std::vector<double> t(g.inf_bits + 1u);
    for (uint32_t p = 0; p <= g.inf_bits; ++p) t[p] = decode(g, p);
    return t;
  };
  static const std::vector<double> f16 = build(kF16Format);
  static const std::vector<double> bf16 = build(kBf16Format);
  return f.mantissa_bits == kF16Format.mantissa_bits ? f16 : bf16;
}

uint16_t reference_narrow(const Format16& f, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) {
    const uint32_t mantissa = bits_of(x) & 0x007fffffu;
    return static_cast<uint16_t>(sign | f.inf_bits | f.quiet_bit() |
                                 (mantissa >> (23 - f.mantissa_bits)));
  }
  const std::vector<double>& table = value_table(f);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= table.back()) return static_cast<uint16_t>(sign | f.inf_bits);
  const auto hi = static_cast<size_t>(std::upper_bound(table.begin(), table.end(), a) -
                                      table.begin());  // first value above a
  const size_t lo = hi - 1;
  if (table[lo] == a) return static_cast<uint16_t>(sign | lo);
  const double mid = (table[lo] + table[hi]) / 2;  // exact: one bit more than either
  const size_t pick = a < mid ? lo : a > mid ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint16_t>(sign | pick);
}

uint32_t reference_widen(const Format16& f, uint16_t pattern) {
  const uint32_t sign = static_cast<uint32_t>(pattern & 0x8000u) << 16;
  const uint32_t magnitude = pattern & 0x7fffu;
  if (magnitude > f.inf_bits) {
    const uint32_t payload = magnitude & ((1u << f.mantissa_bits) - 1u);
    return sign | 0x7f800000u | kF32Quiet | (payload << (23 - f.mantissa_bits));
  }
  if (magnitude == f.inf_bits) return sign | 0x7f800000u;
  const double v = decode(f, magnitude);
  const auto narrowed = static_cast<float>(v);
  EXPECT_EQ(static_cast<double>(narrowed), v) << "f32 cannot hold pattern " << pattern;
  return sign | bits_of(narrowed);
}

// Per-type access to the functions under test, so each test body is written once.
template <typename T>
struct Narrow;
template <>
struct Narrow<Float16> {
  static constexpr const Format16& kFormat = kF16Format;
  static Float16 one(float x) { return to_f16(x); }
  static float widen_one(Float16 x) { return to_f32(x); }
  static auto narrow_kernel(const ConversionKernels& k) { return k.f32_to_f16; }
  static auto widen_kernel(const ConversionKernels& k) { return k.f16_to_f32; }
};
template <>
struct Narrow<BFloat16> {
  static constexpr const Format16& kFormat = kBf16Format;
  static BFloat16 one(float x) { return to_bf16(x); }
  static float widen_one(BFloat16 x) { return to_f32(x); }
  static auto narrow_kernel(const ConversionKernels& k) { return k.f32_to_bf16; }
  static auto widen_kernel(const ConversionKernels& k) { return k.bf16_to_f32; }
};

// "" when `got` and `want` hold the same bits, else a count and the first few differences.
template <typename InRange, typename OutRange>
std::string mismatches(const InRange& in, const OutRange& got, const OutRange& want) {
  size_t wrong = 0;
  std::string first;
  for (size_t i = 0; i < in.size(); ++i) {
    if (bits_of(got[i]) == bits_of(want[i])) continue;
    if (wrong < 5) {
      first += fmt::format("\n  [{}] in {:#x}: got {:#x}, want {:#x}", i, bits_of(in[i]),
                           bits_of(got[i]), bits_of(want[i]));
    }
    ++wrong;
  }
  return wrong == 0 ? "" : fmt::format("{} of {} wrong:{}", wrong, in.size(), first);
}

// Checks the element-wise, scalar bulk, dispatching and every available bulk path against
// the reference on `in`.
template <typename T>
void expect_narrowing_matches_reference(std::span<const float> in) {
  using N = Narrow<T>;
  std::vector<T> want(in.size());
  for (size_t i = 0; i < in.size(); ++i) want[i] = T{reference_narrow(N::kFormat, in[i])};

  std::vector<T> got(in.size());
  for (size_t i = 0; i < in.size(); ++i) got[i] = N::one(in[i]);
  EXPECT_EQ(mismatches(in, got, want), "") << "element-wise";
  scalar::convert(in, std::span<T>(got));
  EXPECT_EQ(mismatches(in, got, want), "") << "scalar::convert";
  convert(in, std::span<T>(got));
  EXPECT_EQ(mismatches(in, got, want), "") << "convert";
  for (const ConversionKernels& k : conversion_kernels()) {
    std::fill(got.begin(), got.end(), T{0x5555});
    N::narrow_kernel(k)(in, got);
    EXPECT_EQ(mismatches(in, got, want), "") << "path " << k.name;
  }
}

template <typename T>
std::vector<T> all_patterns() {
  std::vector<T> v(65536);
  for (uint32_t p = 0; p < v.size(); ++p) v[p] = T{static_cast<uint16_t>(p)};
  return v;
}

// Around every finite pattern: its value, the tie with the next one and the f32 values on
// each side of both, with both signs. This covers ties with odd and even lsb, the overflow
// threshold, the smallest subnormals and the subnormal-to-normal step. Then NaNs with
// payloads in each part of the mantissa, Inf and f32's own extremes.
std::vector<float> edge_values(const Format16& f) {
  std::vector<float> v;
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t p = 0; p < f.inf_bits; ++p) {
    const auto value = static_cast<float>(decode(f, p));
    const auto tie = static_cast<float>((decode(f, p) + decode(f, p + 1)) / 2);  // exact
    for (float x : {value, std::nextafter(value, 0.0f), std::nextafter(value, inf), tie,
                    std::nextafter(tie, 0.0f), std::nextafter(tie, inf)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  for (uint32_t b : {0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x7fa00000u, 0x7f802000u,
                     0x7f801fffu, 0x7f810000u, 0x7f80ffffu, 0x7fbfffffu, 0x00000001u, 0x007fffffu,
                     0x00800000u, 0x7f7fffffu}) {
    v.push_back(float_of(b));
    v.push_back(float_of(b | 0x80000000u));
  }
  return v;
}

std::vector<float> random_bits(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(count);
  for (float& x : v) x = float_of(static_cast<uint32_t>(rng()));
  return v;
}

// ---- names ----

TEST(DTypeTest, NamesRoundTripThroughParse) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t) << dtype_name(t);
  }
  EXPECT_EQ(dtype_name(DType::kF32), "f32");
  EXPECT_EQ(dtype_name(DType::kF16), "f16");
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
}

TEST(DTypeTest, ParseAcceptsCommonAliases) {
  EXPECT_EQ(parse_dtype("fp32"), DType::kF32);
  EXPECT_EQ(parse_dtype("float32"), DType::kF32);
  EXPECT_EQ(parse_dtype("fp16"), DType::kF16);
  EXPECT_EQ(parse_dtype("float16"), DType::kF16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
}

TEST(DTypeTest, ParseRejectsUnknownNames) {
  for (std::string_view name : {"", "f64", "int8", "F32", "bf16 ", "half"}) {
    EXPECT_EQ(parse_dtype(name), std::nullopt) << "'" << name << "'";
  }
}

TEST(DTypeTest, SizesAreInBytes) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(sizeof(Float16), 2u);
  EXPECT_EQ(sizeof(BFloat16), 2u);
}

// ---- paths ----

TEST(ConversionPathTest, ScalarIsAlwaysTheLastPath) {
  const auto kernels = conversion_kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.back().name, "scalar");
  EXPECT_EQ(conversion_path(), kernels.front().name);
}

TEST(ConversionPathTest, UsesTheBestPathTheCpuSupports) {
#if ZERODP_TEST_X86
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c");
  const bool f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  EXPECT_EQ(conversion_path(), avx512 ? "avx512" : f16c ? "f16c" : "scalar");
#else
  EXPECT_EQ(conversion_path(), "scalar");
#endif
}

// ---- widening ----

TEST(WideningTest, F16ToF32IsExactForEveryPattern) {
  const auto in = all_patterns<Float16>();
  std::vector<float> want(in.size());
  for (size_t i = 0; i < in.size(); ++i)
    want[i] = float_of(reference_widen(kF16Format, in[i].bits));
  std::vector<float> got(in.size());
  for (size_t i = 0; i < in.size(); ++i) got[i] = to_f32(in[i]);
  EXPECT_EQ(mismatches(in, got, want), "") << "element-wise";
  for (const ConversionKernels& k : conversion_kernels()) {
    k.f16_to_f32(in, got);
    EXPECT_EQ(mismatches(in, got, want), "") << "path " << k.name;
  }
}

TEST(WideningTest, Bf16ToF32IsExactForEveryPattern) {
  const auto in = all_patterns<BFloat16>();
  std::vector<float> want(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    want[i] = float_of(reference_widen(kBf16Format, in[i].bits));
  }
  std::vector<float> got(in.size());
  for (size_t i = 0; i < in.size(); ++i) got[i] = to_f32(in[i]);
  EXPECT_EQ(mismatches(in, got, want), "") << "element-wise";
  for (const ConversionKernels& k : conversion_kernels()) {
    k.bf16_to_f32(in, got);
    EXPECT_EQ(mismatches(in, got, want), "") << "path " << k.name;
  }
}

TEST(WideningTest, SignallingNaNsComeBackQuiet) {
  EXPECT_EQ(bits_of(to_f32(Float16{0x7c01})), 0x7fc02000u);
  EXPECT_EQ(bits_of(to_f32(Float16{0xfd00})), 0xffe00000u);
  EXPECT_EQ(bits_of(to_f32(BFloat16{0x7f81})), 0x7fc10000u);
  EXPECT_EQ(bits_of(to_f32(BFloat16{0xffbf})), 0xffff0000u);
}

// ---- round trips: every 16-bit pattern ----

template <typename T>
void expect_round_trip_keeps_every_pattern() {
  const Format16& f = Narrow<T>::kFormat;
  const auto in = all_patterns<T>();
  for (const ConversionKernels& k : conversion_kernels()) {
    std::vector<float> wide(in.size());
    std::vector<T> back(in.size());
    Narrow<T>::widen_kernel(k)(in, wide);
    Narrow<T>::narrow_kernel(k)(wide, back);
    std::vector<T> want = in;  // identity, except that signalling NaNs come back quiet
    for (T& p : want) {
      if ((p.bits & 0x7fffu) > f.inf_bits) p.bits = static_cast<uint16_t>(p.bits | f.quiet_bit());
    }
    EXPECT_EQ(mismatches(in, back, want), "") << "path " << k.name;
  }
}

TEST(RoundTripTest, F16ThroughF32KeepsEveryPattern) {
  expect_round_trip_keeps_every_pattern<Float16>();
}

TEST(RoundTripTest, Bf16ThroughF32KeepsEveryPattern) {
  expect_round_trip_keeps_every_pattern<BFloat16>();
}

// ---- narrowing: named cases, then sweeps against the reference ----

TEST(NarrowingTest, F16TiesGoToEven) {
  EXPECT_EQ(to_f16(1.0f + 0x1p-11f).bits, 0x3c00);      // 1 vs 1+2^-10: even is 1
  EXPECT_EQ(to_f16(1.0f + 3 * 0x1p-11f).bits, 0x3c02);  // odd 0x3c01 vs even 0x3c02
  EXPECT_EQ(to_f16(std::nextafter(1.0f + 0x1p-11f, 2.0f)).bits, 0x3c01);      // just above
  EXPECT_EQ(to_f16(std::nextafter(1.0f + 3 * 0x1p-11f, 0.0f)).bits, 0x3c01);  // just below
  EXPECT_EQ(to_f16(-(1.0f + 3 * 0x1p-11f)).bits, 0xbc02);
}

TEST(NarrowingTest, F16OverflowsToInfFrom65520) {
  EXPECT_EQ(to_f16(65504.0f).bits, 0x7bff);  // largest finite
  EXPECT_EQ(to_f16(std::nextafter(65520.0f, 0.0f)).bits, 0x7bff);
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00);  // tie with 2^16: odd 0x7bff loses
  EXPECT_EQ(to_f16(-65520.0f).bits, 0xfc00);
  EXPECT_EQ(to_f16(std::numeric_limits<float>::max()).bits, 0x7c00);
  EXPECT_EQ(to_f16(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
}

TEST(NarrowingTest, F16KeepsSubnormals) {
  EXPECT_EQ(to_f16(0x1p-24f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(to_f16(0x1p-25f).bits, 0x0000);  // tie with 0: even is 0
  EXPECT_EQ(to_f16(std::nextafter(0x1p-25f, 1.0f)).bits, 0x0001);
  EXPECT_EQ(to_f16(3 * 0x1p-25f).bits, 0x0002);           // tie between 1 and 2 units
  EXPECT_EQ(to_f16(0x1p-14f - 0x1p-25f).bits, 0x0400);    // rounds up to the smallest normal
  EXPECT_EQ(to_f16(0x1p-14f - 0x1p-24f).bits, 0x03ff);    // largest subnormal
  EXPECT_EQ(to_f16(float_of(0x00000001u)).bits, 0x0000);  // f32 subnormal
  EXPECT_EQ(to_f16(float_of(0x80000001u)).bits, 0x8000);
  EXPECT_EQ(to_f16(-0.0f).bits, 0x8000);
}

TEST(NarrowingTest, F16NaNStaysQuietNaNWithTopPayload) {
  EXPECT_EQ(to_f16(float_of(0x7fc00000u)).bits, 0x7e00);
  EXPECT_EQ(to_f16(float_of(0x7f800001u)).bits, 0x7e00);  // payload below f16: still NaN
  EXPECT_EQ(to_f16(float_of(0x7fa00000u)).bits, 0x7f00);  // signalling: quieted, payload kept
  EXPECT_EQ(to_f16(float_of(0xff802000u)).bits, 0xfe01);
  EXPECT_EQ(to_f16(float_of(0x7fffffffu)).bits, 0x7fff);  // no rounding into the sign
}

TEST(NarrowingTest, Bf16TiesGoToEven) {
  EXPECT_EQ(to_bf16(float_of(0x3f808000u)).bits, 0x3f80);  // even lsb stays
  EXPECT_EQ(to_bf16(float_of(0x3f818000u)).bits, 0x3f82);  // odd lsb goes up
  EXPECT_EQ(to_bf16(float_of(0x3f808001u)).bits, 0x3f81);  // just above a tie
  EXPECT_EQ(to_bf16(float_of(0x3f817fffu)).bits, 0x3f81);  // just below a tie
  EXPECT_EQ(to_bf16(float_of(0xbf818000u)).bits, 0xbf82);
}

TEST(NarrowingTest, Bf16OverflowsToInfFromTheTieAboveLargestFinite) {
  EXPECT_EQ(to_bf16(float_of(0x7f7f0000u)).bits, 0x7f7f);  // largest finite
  EXPECT_EQ(to_bf16(float_of(0x7f7f7fffu)).bits, 0x7f7f);
  EXPECT_EQ(to_bf16(float_of(0x7f7f8000u)).bits, 0x7f80);  // tie with 2^128: odd loses
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(to_bf16(-std::numeric_limits<float>::max()).bits, 0xff80);
}

TEST(NarrowingTest, Bf16KeepsSubnormals) {
  EXPECT_EQ(to_bf16(float_of(0x00010000u)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(to_bf16(float_of(0x00008000u)).bits, 0x0000);  // tie with 0: even is 0
  EXPECT_EQ(to_bf16(float_of(0x00008001u)).bits, 0x0001);
  EXPECT_EQ(to_bf16(float_of(0x00018000u)).bits, 0x0002);  // tie, odd lsb goes up
  EXPECT_EQ(to_bf16(float_of(0x007f8000u)).bits, 0x0080);  // rounds up to the smallest normal
  EXPECT_EQ(to_bf16(float_of(0x807fffffu)).bits, 0x8080);
  EXPECT_EQ(to_bf16(float_of(0x00000001u)).bits, 0x0000);
}

TEST(NarrowingTest, Bf16NaNStaysQuietNaNWithTopPayload) {
  EXPECT_EQ(to_bf16(float_of(0x7fc00000u)).bits, 0x7fc0);
  EXPECT_EQ(to_bf16(float_of(0x7f800001u)).bits, 0x7fc0);  // payload below bf16: still NaN
  EXPECT_EQ(to_bf16(float_of(0x7f810000u)).bits, 0x7fc1);  // signalling: quieted, payload kept
  EXPECT_EQ(to_bf16(float_of(0xffffffffu)).bits, 0xffff);  // no rounding into the sign
}

TEST(NarrowingTest, F16MatchesReferenceAroundEveryRepresentableValue) {
  expect_narrowing_matches_reference<Float16>(edge_values(kF16Format));
}

TEST(NarrowingTest, Bf16MatchesReferenceAroundEveryRepresentableValue) {
  expect_narrowing_matches_reference<BFloat16>(edge_values(kBf16Format));
}

constexpr size_t kRandomCount = size_t{1} << 22;

TEST(NarrowingTest, F16MatchesReferenceOnRandomBits) {
  expect_narrowing_matches_reference<Float16>(random_bits(kRandomCount, 0x5eed0001));
}

TEST(NarrowingTest, Bf16MatchesReferenceOnRandomBits) {
  expect_narrowing_matches_reference<BFloat16>(random_bits(kRandomCount, 0x5eed0002));
}

// Uniform bits put only 1 in 6 inputs in f16's range; these all sit within two binades of it.
TEST(NarrowingTest, F16MatchesReferenceOnRandomValuesNearItsRange) {
  std::mt19937 rng(0x5eed0003);
  std::uniform_int_distribution<uint32_t> exponent(127 - 27, 127 + 17);
  std::vector<float> in(size_t{1} << 20);
  for (float& x : in) {
    const auto r = static_cast<uint32_t>(rng());
    x = float_of((r & 0x807fffffu) | (exponent(rng) << 23));
  }
  expect_narrowing_matches_reference<Float16>(in);
}

// ---- bulk behaviour ----

// Lengths 0..67 at start offsets 0..3 (so no vector access is aligned by luck), on every path:
// results equal the scalar ones and nothing outside the span is written.
template <typename In, typename Out, typename Fn, typename ScalarFn>
void expect_tails_match_scalar(Fn fn, ScalarFn scalar_fn, std::string_view path) {
  constexpr size_t kGuard = 32;
  const auto source = random_bits(128, 0x5eed0004);
  for (size_t offset = 0; offset < 4; ++offset) {
    for (size_t count = 0; count <= 67; ++count) {
      std::vector<In> in(count);
      for (size_t i = 0; i < count; ++i) {
        const uint32_t b = bits_of(source[i]);
        if constexpr (std::is_same_v<In, float>) {
          in[i] = float_of(b);
        } else {
          in[i] = In{static_cast<uint16_t>(b)};
        }
      }
      std::vector<Out> want(count);
      scalar_fn(std::span<const In>(in), std::span<Out>(want));
      Out sentinel;
      if constexpr (std::is_same_v<Out, float>) {
        sentinel = float_of(0xa5a5a5a5u);
      } else {
        sentinel = Out{0xa5a5};
      }
      std::vector<Out> buffer(offset + count + kGuard, sentinel);
      fn(std::span<const In>(in), std::span<Out>(buffer).subspan(offset, count));
      const std::span<const Out> got = std::span<const Out>(buffer).subspan(offset, count);
      ASSERT_EQ(mismatches(in, got, std::span<const Out>(want)), "")
          << "path " << path << ", count " << count << ", offset " << offset;
      for (size_t i = 0; i < buffer.size(); ++i) {
        if (i >= offset && i < offset + count) continue;
        ASSERT_EQ(bits_of(buffer[i]), bits_of(sentinel))
            << "path " << path << " wrote element " << i << " outside [" << offset << ", "
            << offset + count << ")";
      }
    }
  }
}

TEST(BulkTest, TailsMatchScalarAndStayInBounds) {
  for (const ConversionKernels& k : conversion_kernels()) {
    using F32ToBf16 = void (*)(std::span<const float>, std::span<BFloat16>);
    using F32ToF16 = void (*)(std::span<const float>, std::span<Float16>);
    using Bf16ToF32 = void (*)(std::span<const BFloat16>, std::span<float>);
    using F16ToF32 = void (*)(std::span<const Float16>, std::span<float>);
    expect_tails_match_scalar<float, BFloat16>(k.f32_to_bf16,
                                               static_cast<F32ToBf16>(&scalar::convert), k.name);
    expect_tails_match_scalar<float, Float16>(k.f32_to_f16, static_cast<F32ToF16>(&scalar::convert),
                                              k.name);
    expect_tails_match_scalar<BFloat16, float>(k.bf16_to_f32,
                                               static_cast<Bf16ToF32>(&scalar::convert), k.name);
    expect_tails_match_scalar<Float16, float>(k.f16_to_f32, static_cast<F16ToF32>(&scalar::convert),
                                              k.name);
  }
}

// Calls `fn` with 5 inputs and 7 outputs and checks the error names both lengths.
template <typename In, typename Out, typename Fn>
void expect_length_mismatch_throws(Fn fn, std::string_view path) {
  std::vector<In> in(5);
  std::vector<Out> out(7);
  try {
    fn(std::span<const In>(in), std::span<Out>(out));
    ADD_FAILURE() << "path " << path << " accepted 5 inputs for 7 outputs";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find('5'), std::string::npos) << what;
    EXPECT_NE(what.find('7'), std::string::npos) << what;
  }
}

TEST(BulkTest, LengthMismatchThrowsNamingBothLengths) {
  std::vector<ConversionKernels> all(conversion_kernels().begin(), conversion_kernels().end());
  all.push_back(ConversionKernels{
      .name = "convert",
      .f32_to_bf16 = [](std::span<const float> i, std::span<BFloat16> o) { convert(i, o); },
      .f32_to_f16 = [](std::span<const float> i, std::span<Float16> o) { convert(i, o); },
      .bf16_to_f32 = [](std::span<const BFloat16> i, std::span<float> o) { convert(i, o); },
      .f16_to_f32 = [](std::span<const Float16> i, std::span<float> o) { convert(i, o); },
  });
  for (const ConversionKernels& k : all) {
    expect_length_mismatch_throws<float, BFloat16>(k.f32_to_bf16, k.name);
    expect_length_mismatch_throws<float, Float16>(k.f32_to_f16, k.name);
    expect_length_mismatch_throws<BFloat16, float>(k.bf16_to_f32, k.name);
    expect_length_mismatch_throws<Float16, float>(k.f16_to_f32, k.name);
  }
}

#if ZERODP_TEST_X86
// Sets flush-to-zero, denormals-are-zero and round-toward-zero for its lifetime.
class HostileMxcsr {
 public:
  HostileMxcsr() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8000u | 0x0040u | 0x6000u); }
  ~HostileMxcsr() { _mm_setcsr(saved_); }
  HostileMxcsr(const HostileMxcsr&) = delete;
  HostileMxcsr& operator=(const HostileMxcsr&) = delete;

 private:
  unsigned int saved_;
};

// A training loop may turn on FTZ/DAZ for speed; conversions must not change with it.
TEST(BulkTest, ResultsIgnoreFlushToZeroDenormalsAreZeroAndRoundingMode) {
  const std::vector<float> f16_in = edge_values(kF16Format);
  const std::vector<float> bf16_in = edge_values(kBf16Format);
  const auto f16_all = all_patterns<Float16>();
  const auto bf16_all = all_patterns<BFloat16>();
  std::vector<Float16> f16_want(f16_in.size());
  std::vector<BFloat16> bf16_want(bf16_in.size());
  std::vector<float> f16_wide_want(f16_all.size());
  std::vector<float> bf16_wide_want(bf16_all.size());
  scalar::convert(f16_in, std::span<Float16>(f16_want));
  scalar::convert(bf16_in, std::span<BFloat16>(bf16_want));
  scalar::convert(f16_all, f16_wide_want);
  scalar::convert(bf16_all, bf16_wide_want);

  for (const ConversionKernels& k : conversion_kernels()) {
    std::vector<Float16> f16_got(f16_in.size());
    std::vector<BFloat16> bf16_got(bf16_in.size());
    std::vector<float> f16_wide_got(f16_all.size());
    std::vector<float> bf16_wide_got(bf16_all.size());
    {
      HostileMxcsr mxcsr;
      k.f32_to_f16(f16_in, f16_got);
      k.f32_to_bf16(bf16_in, bf16_got);
      k.f16_to_f32(f16_all, f16_wide_got);
      k.bf16_to_f32(bf16_all, bf16_wide_got);
    }
    EXPECT_EQ(mismatches(f16_in, f16_got, f16_want), "") << "path " << k.name;
    EXPECT_EQ(mismatches(bf16_in, bf16_got, bf16_want), "") << "path " << k.name;
    EXPECT_EQ(mismatches(f16_all, f16_wide_got, f16_wide_want), "") << "path " << k.name;
    EXPECT_EQ(mismatches(bf16_all, bf16_wide_got, bf16_wide_want), "") << "path " << k.name;
  }
}
#endif  // ZERODP_TEST_X86

}  // namespace
}  // namespace zerodp
