// moments8.h is the contract.
#include "optim/moments8.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"
#include "optim/adamw_kernel.h"

namespace zerodp {
namespace {

// The encode and decode loops as nn/ compiles its loops (nn/vecmath.h): one clone per x86-64
// level, chosen at load time. They are integer operations and one IEEE multiply per element,
// so every clone gives the same bits; not under ThreadSanitizer, whose runtime is not set up
// when the loader runs the clones' resolvers.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
#define ZERODP_MOMENTS_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZERODP_MOMENTS_CLONES
#endif

// ---- The current code (kFloat8, "e3m4/ue4m4"; see moments8.h) ----

// A float's bits >> 19 (its exponent field and top 4 mantissa bits) of 1.0f.
constexpr int32_t kOneTop = 0x3F800000 >> 19;
// Code = rounded top bits - offset: m's magnitude 127 and v's byte 255 are 1.
constexpr int32_t kMOffset = kOneTop - 127;
constexpr int32_t kVOffset = kOneTop - 255;
// Half of one code step in the bits: added before the shift, it rounds to nearest, ties up.
constexpr uint32_t kHalfStep = 1u << 18;
// Half of m's smallest magnitude (2^-8 * 1.125): the midpoint between it and 0. Halving a
// normal float takes one from its exponent field.
constexpr uint32_t kMFlushBits = (static_cast<uint32_t>(kMOffset + 1) << 19) - (1u << 23);

[[gnu::always_inline]] inline int32_t rounded_top(uint32_t magnitude_bits) {
  return static_cast<int32_t>((magnitude_bits + kHalfStep) >> 19);
}

// Written branch-free on integers so that a loop of them vectorizes.
[[gnu::always_inline]] inline uint8_t encode_m(float y) {
  const uint32_t b = std::bit_cast<uint32_t>(y);
  const uint32_t a = b & 0x7FFFFFFFu;
  int32_t c = rounded_top(a) - kMOffset;
  c = c > 127 ? 127 : c;  // y past 1 (or NaN)
  // Below the smallest magnitude the next value down is 0, not the grid's: compare with the
  // midpoint. Above it the rounding already gives c >= 1.
  const int32_t least = a >= kMFlushBits ? 1 : 0;
  c = c < least ? least : c;
  return static_cast<uint8_t>((b >> 31) != 0 ? 128 - c : 128 + c);
}

[[gnu::always_inline]] inline uint8_t encode_v(float y) {
  const uint32_t b = std::bit_cast<uint32_t>(y);
  // A negative y (v never is one) is below every value: byte 0, as any y below 2^-16 is.
  const uint32_t a = static_cast<int32_t>(b) < 0 ? 0u : b;
  int32_t c = rounded_top(a) - kVOffset;
  c = c < 0 ? 0 : c;
  c = c > 255 ? 255 : c;
  return static_cast<uint8_t>(c);
}

[[gnu::always_inline]] inline float decode_m(uint8_t code) {
  const int32_t q = static_cast<int32_t>(code) - 128;
  const int32_t c = q < 0 ? -q : q;
  const uint32_t magnitude = c == 0 ? 0u : static_cast<uint32_t>(c + kMOffset) << 19;
  return std::bit_cast<float>(magnitude | (static_cast<uint32_t>(q) & 0x80000000u));
}

[[gnu::always_inline]] inline float decode_v(uint8_t code) {
  return std::bit_cast<float>(static_cast<uint32_t>(code + kVOffset) << 19);
}

// max |x| as the largest of the magnitudes' bit patterns, which order as the magnitudes do (a
// NaN's is larger than any number's, so a NaN block keeps a NaN scale): an integer reduction
// that vectorizes.
[[gnu::always_inline]] inline uint32_t abs_max_bits(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
  return m;
}

// One correctly rounded division per block. An all-zero block gets 0, so its elements encode
// as y = 0 (m's zero, v's smallest value) and decode to zeros through the scale 0.
[[gnu::always_inline]] inline float inverse_of(float absmax) {
  return absmax == 0 ? 0.0f : 1.0f / absmax;
}

// The end of block k of a run of `n` elements whose first block is `first` long, given its
// begin `b`.
[[gnu::always_inline]] inline size_t block_end(size_t n, size_t first, size_t b, size_t k) {
  return std::min(n, k == 0 ? first : b + kMomentBlock);
}

ZERODP_MOMENTS_CLONES void encode_run(const float* x, size_t n, size_t first, bool is_signed,
                                      uint8_t* codes, float* scales) {
  for (size_t b = 0, k = 0; b < n; ++k) {
    const size_t e = block_end(n, first, b, k);
    const float absmax = std::bit_cast<float>(abs_max_bits(x + b, e - b));
    const float inverse = inverse_of(absmax);
    if (is_signed) {
      for (size_t i = b; i < e; ++i) codes[i] = encode_m(x[i] * inverse);
    } else {
      for (size_t i = b; i < e; ++i) codes[i] = encode_v(x[i] * inverse);
    }
    scales[k] = absmax;
    b = e;
  }
}

ZERODP_MOMENTS_CLONES void decode_run(const uint8_t* codes, const float* scales, size_t n,
                                      size_t first, bool is_signed, float* out) {
  for (size_t b = 0, k = 0; b < n; ++k) {
    const size_t e = block_end(n, first, b, k);
    const float scale = scales[k];
    if (is_signed) {
      for (size_t i = b; i < e; ++i) out[i] = decode_m(codes[i]) * scale;
    } else {
      for (size_t i = b; i < e; ++i) out[i] = decode_v(codes[i]) * scale;
    }
    b = e;
  }
}

// Both moments of a run, block by block: each block's m and v while they are in L1.
ZERODP_MOMENTS_CLONES void encode_both(const float* __restrict m, const float* __restrict v,
                                       size_t n, size_t first, uint8_t* __restrict mc,
                                       uint8_t* __restrict vc, float* __restrict ms,
                                       float* __restrict vs) {
  for (size_t b = 0, k = 0; b < n; ++k) {
    const size_t e = block_end(n, first, b, k);
    const float m_max = std::bit_cast<float>(abs_max_bits(m + b, e - b));
    const float v_max = std::bit_cast<float>(abs_max_bits(v + b, e - b));
    const float m_inverse = inverse_of(m_max), v_inverse = inverse_of(v_max);
    for (size_t i = b; i < e; ++i) {
      mc[i] = encode_m(m[i] * m_inverse);
      vc[i] = encode_v(v[i] * v_inverse);
    }
    ms[k] = m_max;
    vs[k] = v_max;
    b = e;
  }
}

ZERODP_MOMENTS_CLONES void decode_both(const uint8_t* __restrict mc, const uint8_t* __restrict vc,
                                       const float* __restrict ms, const float* __restrict vs,
                                       size_t n, size_t first, float* __restrict m,
                                       float* __restrict v) {
  for (size_t b = 0, k = 0; b < n; ++k) {
    const size_t e = block_end(n, first, b, k);
    const float m_scale = ms[k], v_scale = vs[k];
    for (size_t i = b; i < e; ++i) {
      m[i] = decode_m(mc[i]) * m_scale;
      v[i] = decode_v(vc[i]) * v_scale;
    }
    b = e;
  }
}

// The update on a run, one block at a time: decode both moments, update master, m and v in
// fp32 (adamw_element), keeping the new moments of the block in L1 and their maxima, then
// encode them. The same operations as decode_both, the fp32 kernel and encode_both in turn, in
// one pass over the run's bytes.
ZERODP_MOMENTS_CLONES void update_run(float* __restrict p, const float* __restrict grad,
                                      uint8_t* __restrict mc, uint8_t* __restrict vc,
                                      float* __restrict ms, float* __restrict vs, size_t n,
                                      size_t first, const AdamWCoefficients c, float grad_scale) {
  alignas(64) float m[kMomentBlock];
  alignas(64) float v[kMomentBlock];
  for (size_t b = 0, k = 0; b < n; ++k) {
    const size_t len = block_end(n, first, b, k) - b;
    float* __restrict pb = p + b;
    const float* __restrict gb = grad + b;
    uint8_t* __restrict mcb = mc + b;
    uint8_t* __restrict vcb = vc + b;
    const float m_scale = ms[k], v_scale = vs[k];
    uint32_t m_max = 0, v_max = 0;
    for (size_t i = 0; i < len; ++i) {
      float mi = decode_m(mcb[i]) * m_scale;
      float vi = decode_v(vcb[i]) * v_scale;
      adamw_element(pb[i], mi, vi, gb[i], c, grad_scale);
      m[i] = mi;
      v[i] = vi;
      m_max = std::max(m_max, std::bit_cast<uint32_t>(mi) & 0x7FFFFFFFu);
      v_max = std::max(v_max, std::bit_cast<uint32_t>(vi) & 0x7FFFFFFFu);
    }
    const float m_inverse = inverse_of(std::bit_cast<float>(m_max));
    const float v_inverse = inverse_of(std::bit_cast<float>(v_max));
    for (size_t i = 0; i < len; ++i) {
      mcb[i] = encode_m(m[i] * m_inverse);
      vcb[i] = encode_v(v[i] * v_inverse);
    }
    ms[k] = std::bit_cast<float>(m_max);
    vs[k] = std::bit_cast<float>(v_max);
    b += len;
  }
}

const std::array<float, 256>& float8_values(bool is_signed) {
  static const std::array<float, 256> m = [] {
    std::array<float, 256> a{};
    for (size_t i = 0; i < a.size(); ++i) a[i] = decode_m(static_cast<uint8_t>(i));
    return a;
  }();
  static const std::array<float, 256> v = [] {
    std::array<float, 256> a{};
    for (size_t i = 0; i < a.size(); ++i) a[i] = decode_v(static_cast<uint8_t>(i));
    return a;
  }();
  return is_signed ? m : v;
}

// ---- The decades code (kDecades), for decoding checkpoints written in it ----
//
// Seven decades, 10^-7 .. 1, each a linear grid of midpoints, finer in the upper decades:
//   signed:   0, +-1, and per sign 2^i midpoints in decade [10^(i-7), 10^(i-6)] for
//             i = 1..6 (126), plus one positive value in the lowest decade, 0.55e-6.
//   unsigned: 1, 10^-7, and 2^(i+1) midpoints in decade i = 0..6 (254).
// A code byte is the value's index in ascending order. The values are computed in double and
// rounded to fp32 once, as they were when the checkpoints were written.

// `per_decade(i)` midpoints of the linear grid on [0.1, 1] scaled into decade i
// ([10^(i-7), 10^(i-6)]), for i in [first, 7).
void add_decades(std::vector<double>& out, int first, int (*per_decade)(int), double sign) {
  for (int i = first; i < 7; ++i) {
    const int n = per_decade(i);
    for (int k = 0; k < n; ++k) {
      out.push_back(sign * std::pow(10.0, i - 6) * (0.1 + 0.9 * (k + 0.5) / n));
    }
  }
}

std::array<float, 256> make_decades(bool is_signed) {
  std::vector<double> v;
  if (is_signed) {
    v = {0.0, 1.0, -1.0, std::pow(10.0, -6) * 0.55};
    for (double sign : {1.0, -1.0})
      add_decades(
          v, 1, [](int i) { return 1 << i; }, sign);
  } else {
    v = {1.0, 1e-7};
    add_decades(
        v, 0, [](int i) { return 2 << i; }, 1.0);
  }
  if (v.size() != 256) throw std::logic_error("decades moment code: not 256 values");
  std::sort(v.begin(), v.end());
  std::array<float, 256> values{};
  for (size_t i = 0; i < 256; ++i) values[i] = static_cast<float>(v[i]);
  return values;
}

const std::array<float, 256>& decades_values(bool is_signed) {
  static const std::array<float, 256> signed_code = make_decades(true);
  static const std::array<float, 256> unsigned_code = make_decades(false);
  return is_signed ? signed_code : unsigned_code;
}

void check_run(const QuantizedMoments& q, size_t count) {
  const size_t blocks = moment_blocks(count, q.first);
  if (q.m.size() != count || q.v.size() != count || q.m_scale.size() != blocks ||
      q.v_scale.size() != blocks) {
    throw InvalidArgument(fmt::format(
        "int8 moments: a run of {} elements in {} blocks got {} and {} codes, {} and {} scales",
        count, blocks, q.m.size(), q.v.size(), q.m_scale.size(), q.v_scale.size()));
  }
}

}  // namespace

std::string_view moment_code_name(MomentCode code) {
  switch (code) {
    case MomentCode::kDecades:
      return "decades";
    case MomentCode::kFloat8:
      return "e3m4/ue4m4";
  }
  throw InvalidArgument(fmt::format("int8 moments: no moment code {}", static_cast<int>(code)));
}

std::optional<MomentCode> parse_moment_code(std::string_view name) {
  for (MomentCode c : {MomentCode::kDecades, MomentCode::kFloat8}) {
    if (name == moment_code_name(c)) return c;
  }
  return std::nullopt;
}

std::span<const float> moment_code(bool is_signed, MomentCode code) {
  (void)moment_code_name(code);  // rejects a value outside the enum
  return code == MomentCode::kDecades ? decades_values(is_signed) : float8_values(is_signed);
}

uint8_t encode_moment(float normalized, bool is_signed) {
  return is_signed ? encode_m(normalized) : encode_v(normalized);
}

float quantize_moment_block(std::span<const float> x, bool is_signed, uint8_t* codes) {
  float scale = 0;
  if (!x.empty()) encode_run(x.data(), x.size(), x.size(), is_signed, codes, &scale);
  return scale;
}

void dequantize_moment_block(const uint8_t* codes, float scale, bool is_signed,
                             std::span<float> out) {
  if (!out.empty()) decode_run(codes, &scale, out.size(), out.size(), is_signed, out.data());
}

size_t moment_blocks(size_t count, size_t first) {
  if (first < 1 || first > kMomentBlock) {
    throw InvalidArgument(
        fmt::format("int8 moments: a first block of {} elements; use 1..{}", first, kMomentBlock));
  }
  if (count <= first) return count > 0 ? 1 : 0;
  return 1 + (count - first + kMomentBlock - 1) / kMomentBlock;
}

MomentCounts moment_counts(std::span<const uint64_t> tensors, uint64_t begin, uint64_t end) {
  MomentCounts c;
  uint64_t at = 0;
  for (uint64_t t : tensors) {
    const uint64_t b = std::max(at, begin), e = std::min(at + t, end);
    at += t;
    if (b >= e) continue;
    if (!moments_quantized(t)) {
      c.fp32 += e - b;
      continue;
    }
    c.codes += e - b;
    c.blocks += moment_blocks(e - b, std::min<uint64_t>(kMomentBlock - b % kMomentBlock, e - b));
  }
  return c;
}

void dequantize_moment_run(std::span<const uint8_t> codes, std::span<const float> scales,
                           size_t first, bool is_signed, std::span<float> out, MomentCode code) {
  if (codes.size() != out.size() || scales.size() != moment_blocks(out.size(), first)) {
    throw InvalidArgument(
        fmt::format("int8 moments: a run of {} elements got {} codes and {} scales", out.size(),
                    codes.size(), scales.size()));
  }
  if (code == kCurrentMomentCode) {
    decode_run(codes.data(), scales.data(), out.size(), first, is_signed, out.data());
    return;
  }
  const std::span<const float> values = moment_code(is_signed, code);
  for (size_t b = 0, k = 0; b < out.size(); ++k) {
    const size_t e = block_end(out.size(), first, b, k);
    for (size_t i = b; i < e; ++i) out[i] = values[codes[i]] * scales[k];
    b = e;
  }
}

void dequantize_moments(const QuantizedMoments& q, std::span<float> m, std::span<float> v) {
  check_run(q, m.size());
  if (v.size() != m.size()) {
    throw InvalidArgument(
        fmt::format("int8 moments: {} and {} elements of m and v", m.size(), v.size()));
  }
  decode_both(q.m.data(), q.v.data(), q.m_scale.data(), q.v_scale.data(), m.size(), q.first,
              m.data(), v.data());
}

void quantize_moments(std::span<const float> m, std::span<const float> v,
                      const QuantizedMoments& q) {
  check_run(q, m.size());
  if (v.size() != m.size()) {
    throw InvalidArgument(
        fmt::format("int8 moments: {} and {} elements of m and v", m.size(), v.size()));
  }
  encode_both(m.data(), v.data(), m.size(), q.first, q.m.data(), q.v.data(), q.m_scale.data(),
              q.v_scale.data());
}

void adamw8_update(std::span<float> master, std::span<const float> grad, const QuantizedMoments& q,
                   bool decay, const AdamWConfig& config, int64_t step, float grad_scale) {
  check_run(q, master.size());
  if (grad.size() != master.size()) {
    throw InvalidArgument(fmt::format("int8 moments: {} gradients for {} master weights",
                                      grad.size(), master.size()));
  }
  validate(config);
  if (step < 1 || !std::isfinite(grad_scale)) {
    throw InvalidArgument(fmt::format(
        "int8 moments: step {} with grad_scale {}; Adam's step counter is 1-based and the scale "
        "must be finite",
        step, grad_scale));
  }
  if (master.empty()) return;
  update_run(master.data(), grad.data(), q.m.data(), q.v.data(), q.m_scale.data(), q.v_scale.data(),
             master.size(), q.first, adamw_coefficients(config, step, decay), grad_scale);
}

}  // namespace zerodp
