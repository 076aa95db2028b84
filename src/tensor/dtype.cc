// Element-type conversions: the portable scalar rules and the x86 vector paths.
//
// The scalar code works on bit patterns in integers only, so it is the reference semantics on
// any CPU and no MXCSR setting (FTZ, DAZ, rounding mode) can change it. The vector paths are
// compiled per function with target attributes, so the library still runs on any x86-64, and
// are chosen once, at the first call, from what the CPU reports.
#include "tensor/dtype.h"

#include <array>
#include <bit>

#include <fmt/format.h>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12.2's AVX-512 intrinsics start from `__m512i __Y = __Y;` (_mm512_undefined_*), which
// -Wmaybe-uninitialized reports at their location once inlined (GCC bug 105593, fixed in
// 12.3); silence it for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define ZERODP_DTYPE_X86 1
#else
#define ZERODP_DTYPE_X86 0
#endif

namespace zerodp {
namespace {

constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;            // |x| above this is NaN
constexpr uint32_t kF32QuietBit = 0x00400000u;       // top mantissa bit
constexpr uint32_t kF32MinF16Normal = 0x38800000u;   // 2^-14
constexpr uint32_t kF32F16Overflow = 0x477ff000u;    // 65520: the tie between 65504 and 2^16
constexpr uint32_t kF32HalfF16MinSub = 0x33000000u;  // 2^-25: the tie between 0 and 2^-24
constexpr uint32_t kF32ToF16ExpRebias = 112u << 23;  // f32 bias 127 minus f16 bias 15

inline uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }
inline float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }

inline uint16_t f32_bits_to_bf16(uint32_t u) {
  if ((u & kF32AbsMask) > kF32Inf) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff rounds every discarded half below 0x8000 down and above it up; adding the
  // kept lsb as well makes exact ties go to even. A carry into the exponent gives the next
  // binade, and past the largest finite that is Inf, as it should be.
  const uint32_t kept_lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + kept_lsb) >> 16);
}

inline uint16_t f32_bits_to_f16(uint32_t u) {
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & kF32AbsMask;
  if (a > kF32Inf) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x01ffu));
  if (a >= kF32F16Overflow) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= kF32MinF16Normal) {
    // Same trick as bf16 on the 13 discarded bits, after moving the exponent to f16's bias.
    const uint32_t r = a - kF32ToF16ExpRebias;
    const uint32_t kept_lsb = (r >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((r + 0x0fffu + kept_lsb) >> 13));
  }
  if (a <= kF32HalfF16MinSub) return sign;  // f32 subnormals land here too: they round to 0
  // f16 subnormal: the result counts units of 2^-24. With the implicit bit, a is
  // m * 2^(e - 150), so the count is m >> (126 - e), rounded. A result of 0x400 is the
  // smallest normal, which the encoding gives for free.
  const uint32_t e = a >> 23;  // 102..112 here
  const uint32_t m = (a & 0x007fffffu) | 0x00800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
  return static_cast<uint16_t>(sign | q);
}

inline uint32_t bf16_to_f32_bits(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  if ((u & kF32AbsMask) > kF32Inf) u |= kF32QuietBit;
  return u;
}

inline uint32_t f16_to_f32_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x03ffu;
  if (e == 0x1f) return sign | kF32Inf | (m << 13) | (m != 0 ? kF32QuietBit : 0u);
  if (e != 0) return sign | ((e + 112u) << 23) | (m << 13);
  if (m == 0) return sign;
  // Subnormal m * 2^-24: normalise so the leading one of m becomes the implicit bit.
  const auto lead = static_cast<uint32_t>(std::bit_width(m) - 1);  // 0..9
  return sign | ((lead + 103u) << 23) | ((m << (23u - lead)) & 0x007fffffu);
}

void check_lengths(std::string_view conversion, size_t in_count, size_t out_count) {
  if (in_count != out_count) {
    throw InvalidArgument(fmt::format(
        "convert {}: input holds {} elements but output holds {}; pass spans of equal length",
        conversion, in_count, out_count));
  }
}

// The 16-bit storage types are bare uint16_t patterns; the loops below address them as such.
static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2);

}  // namespace

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kU8:
      return "u8";
  }
  throw InvalidArgument(fmt::format("dtype_name: {} is not a DType (f32=0, f16=1, bf16=2, u8=3)",
                                    static_cast<int>(t)));
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::kF32;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  return std::nullopt;
}

float to_f32(BFloat16 x) { return float_of(bf16_to_f32_bits(x.bits)); }
float to_f32(Float16 x) { return float_of(f16_to_f32_bits(x.bits)); }
BFloat16 to_bf16(float x) { return BFloat16{f32_bits_to_bf16(bits_of(x))}; }
Float16 to_f16(float x) { return Float16{f32_bits_to_f16(bits_of(x))}; }

namespace scalar {

void convert(std::span<const float> in, std::span<BFloat16> out) {
  check_lengths("f32 -> bf16", in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i].bits = f32_bits_to_bf16(bits_of(in[i]));
}

void convert(std::span<const float> in, std::span<Float16> out) {
  check_lengths("f32 -> f16", in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i].bits = f32_bits_to_f16(bits_of(in[i]));
}

void convert(std::span<const BFloat16> in, std::span<float> out) {
  check_lengths("bf16 -> f32", in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = float_of(bf16_to_f32_bits(in[i].bits));
}

void convert(std::span<const Float16> in, std::span<float> out) {
  check_lengths("f16 -> f32", in.size(), out.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = float_of(f16_to_f32_bits(in[i].bits));
}

}  // namespace scalar

namespace {

constexpr ConversionKernels kScalarKernels{
    .name = "scalar",
    .f32_to_bf16 =
        static_cast<void (*)(std::span<const float>, std::span<BFloat16>)>(&scalar::convert),
    .f32_to_f16 =
        static_cast<void (*)(std::span<const float>, std::span<Float16>)>(&scalar::convert),
    .bf16_to_f32 =
        static_cast<void (*)(std::span<const BFloat16>, std::span<float>)>(&scalar::convert),
    .f16_to_f32 =
        static_cast<void (*)(std::span<const Float16>, std::span<float>)>(&scalar::convert),
};

#if ZERODP_DTYPE_X86

// ---- AVX-512: 16 lanes, tails through masked loads and stores. ----
// f16 uses vcvtps2ph / vcvtph2ps: the rounding comes from the immediate, not MXCSR, and
// neither instruction flushes subnormals (FTZ is ignored; DAZ could only touch f32
// subnormal inputs, which round to a signed zero in f16 either way). Both quiet NaNs and keep
// the top payload bits exactly as the scalar rules do. bf16 is rounded in integers, not with
// vcvtneps2bf16, because that instruction flushes subnormal inputs and outputs.
#define ZERODP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

// The first `count` (0..16) lanes.
ZERODP_AVX512 inline __mmask16 tail_mask16(size_t count) {
  return static_cast<__mmask16>((1u << count) - 1u);
}

ZERODP_AVX512 inline __m512i bf16_round_avx512(__m512i u) {
  const __m512i kept_lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i biased = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(biased, kept_lsb), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __m512i magnitude = _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(kF32AbsMask)));
  const __mmask16 is_nan =
      _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(static_cast<int>(kF32Inf)));
  return _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
}

ZERODP_AVX512 inline __m512i bf16_widen_avx512(__m256i h) {
  const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
  const __m512i magnitude = _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(kF32AbsMask)));
  const __mmask16 is_nan =
      _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(static_cast<int>(kF32Inf)));
  return _mm512_mask_or_epi32(u, is_nan, u, _mm512_set1_epi32(static_cast<int>(kF32QuietBit)));
}

ZERODP_AVX512 void f32_to_bf16_avx512(std::span<const float> in, std::span<BFloat16> out) {
  check_lengths("f32 -> bf16", in.size(), out.size());
  const float* src = in.data();
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  const size_t n = in.size();
  size_t i = 0;
  // (Packing two vectors' high halves with one vpermt2w instead measured 20% slower on Zen.)
  for (; i + 16 <= n; i += 16) {
    const __m512i r = bf16_round_avx512(_mm512_loadu_si512(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  if (i < n) {
    const __mmask16 mask = tail_mask16(n - i);
    const __m512i r = bf16_round_avx512(_mm512_maskz_loadu_epi32(mask, src + i));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, mask, r);
  }
}

ZERODP_AVX512 void f32_to_f16_avx512(std::span<const float> in, std::span<Float16> out) {
  check_lengths("f32 -> f16", in.size(), out.size());
  const float* src = in.data();
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  const size_t n = in.size();
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRound);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  if (i < n) {
    const __mmask16 mask = tail_mask16(n - i);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(mask, src + i), kRound);
    _mm256_mask_storeu_epi16(dst + i, mask, h);
  }
}

ZERODP_AVX512 void bf16_to_f32_avx512(std::span<const BFloat16> in, std::span<float> out) {
  check_lengths("bf16 -> f32", in.size(), out.size());
  const auto* src = reinterpret_cast<const uint16_t*>(in.data());
  float* dst = out.data();
  const size_t n = in.size();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, bf16_widen_avx512(h));
  }
  if (i < n) {
    const __mmask16 mask = tail_mask16(n - i);
    const __m512i u = bf16_widen_avx512(_mm256_maskz_loadu_epi16(mask, src + i));
    _mm512_mask_storeu_epi32(dst + i, mask, u);
  }
}

ZERODP_AVX512 void f16_to_f32_avx512(std::span<const Float16> in, std::span<float> out) {
  check_lengths("f16 -> f32", in.size(), out.size());
  const auto* src = reinterpret_cast<const uint16_t*>(in.data());
  float* dst = out.data();
  const size_t n = in.size();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  if (i < n) {
    const __mmask16 mask = tail_mask16(n - i);
    _mm512_mask_storeu_ps(dst + i, mask, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, src + i)));
  }
}

// ---- F16C + AVX2: 8 lanes, tails through the scalar rules. ----
#define ZERODP_F16C __attribute__((target("avx2,f16c")))

ZERODP_F16C inline __m256i bf16_round_avx2(__m256i u) {
  const __m256i kept_lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i biased = _mm256_add_epi32(u, _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(biased, kept_lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  // |u| <= 0x7fffffff, so the signed compare is an unsigned one here.
  const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(kF32AbsMask)));
  const __m256i is_nan =
      _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(static_cast<int>(kF32Inf)));
  return _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
}

ZERODP_F16C void f32_to_bf16_f16c(std::span<const float> in, std::span<BFloat16> out) {
  check_lengths("f32 -> bf16", in.size(), out.size());
  const float* src = in.data();
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  const size_t n = in.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i r =
        bf16_round_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    // Every lane is <= 0xffff, so unsigned saturation packs without changing a value.
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_bits_to_bf16(bits_of(src[i]));
}

ZERODP_F16C void f32_to_f16_f16c(std::span<const float> in, std::span<Float16> out) {
  check_lengths("f32 -> f16", in.size(), out.size());
  const float* src = in.data();
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  const size_t n = in.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_bits_to_f16(bits_of(src[i]));
}

ZERODP_F16C void bf16_to_f32_f16c(std::span<const BFloat16> in, std::span<float> out) {
  check_lengths("bf16 -> f32", in.size(), out.size());
  const auto* src = reinterpret_cast<const uint16_t*>(in.data());
  float* dst = out.data();
  const size_t n = in.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(kF32AbsMask)));
    const __m256i is_nan =
        _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(static_cast<int>(kF32Inf)));
    const __m256i quiet =
        _mm256_and_si256(is_nan, _mm256_set1_epi32(static_cast<int>(kF32QuietBit)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_or_si256(u, quiet));
  }
  for (; i < n; ++i) dst[i] = float_of(bf16_to_f32_bits(src[i]));
}

ZERODP_F16C void f16_to_f32_f16c(std::span<const Float16> in, std::span<float> out) {
  check_lengths("f16 -> f32", in.size(), out.size());
  const auto* src = reinterpret_cast<const uint16_t*>(in.data());
  float* dst = out.data();
  const size_t n = in.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = float_of(f16_to_f32_bits(src[i]));
}

constexpr ConversionKernels kAvx512Kernels{
    .name = "avx512",
    .f32_to_bf16 = &f32_to_bf16_avx512,
    .f32_to_f16 = &f32_to_f16_avx512,
    .bf16_to_f32 = &bf16_to_f32_avx512,
    .f16_to_f32 = &f16_to_f32_avx512,
};

constexpr ConversionKernels kF16cKernels{
    .name = "f16c",
    .f32_to_bf16 = &f32_to_bf16_f16c,
    .f32_to_f16 = &f32_to_f16_f16c,
    .bf16_to_f32 = &bf16_to_f32_f16c,
    .f16_to_f32 = &f16_to_f32_f16c,
};

#endif  // ZERODP_DTYPE_X86

struct KernelList {
  std::array<ConversionKernels, 3> entries;
  size_t count = 0;
};

KernelList detect_kernels() {
  KernelList list;
#if ZERODP_DTYPE_X86
  // libgcc also checks (XGETBV) that the OS saves the wide registers before reporting these.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c")) {
    list.entries[list.count++] = kAvx512Kernels;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
    list.entries[list.count++] = kF16cKernels;
  }
#endif
  list.entries[list.count++] = kScalarKernels;
  return list;
}

const ConversionKernels& active_kernels() { return conversion_kernels().front(); }

}  // namespace

std::span<const ConversionKernels> conversion_kernels() {
  static const KernelList list = detect_kernels();
  return {list.entries.data(), list.count};
}

std::string_view conversion_path() { return active_kernels().name; }

void convert(std::span<const float> in, std::span<BFloat16> out) {
  active_kernels().f32_to_bf16(in, out);
}
void convert(std::span<const float> in, std::span<Float16> out) {
  active_kernels().f32_to_f16(in, out);
}
void convert(std::span<const BFloat16> in, std::span<float> out) {
  active_kernels().bf16_to_f32(in, out);
}
void convert(std::span<const Float16> in, std::span<float> out) {
  active_kernels().f16_to_f32(in, out);
}

}  // namespace zerodp
