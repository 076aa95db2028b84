// moments8.h is the contract.
#include "optim/moments8.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {
namespace {

// A code's values, the midpoints between neighbours, and for each of the 65536 values of a
// float's top 16 bits the number of midpoints below the bucket's lowest value: encoding
// starts there and steps over the one or two midpoints the bucket may still straddle.
struct Code {
  std::array<float, 256> values{};
  // 255 midpoints, then +inf so that index 255 compares false.
  std::array<float, 256> midpoints{};
  std::vector<uint8_t> start;
};

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

Code make_code(bool is_signed) {
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
  if (v.size() != 256) throw std::logic_error("moment code: not 256 values");
  std::sort(v.begin(), v.end());
  Code c;
  for (size_t i = 0; i < 256; ++i) c.values[i] = static_cast<float>(v[i]);
  for (size_t i = 0; i < 255; ++i) {
    c.midpoints[i] = static_cast<float>((static_cast<double>(c.values[i]) + c.values[i + 1]) / 2);
  }
  c.midpoints[255] = std::numeric_limits<float>::infinity();
  const auto below = [&](float x) {
    return static_cast<size_t>(std::lower_bound(c.midpoints.begin(), c.midpoints.begin() + 255, x) -
                               c.midpoints.begin());
  };
  c.start.resize(size_t{1} << 16);
  for (uint32_t b = 0; b < (1u << 16); ++b) {
    // The bucket's lowest and highest values (by magnitude the other way round when negative).
    const bool negative = (b & 0x8000u) != 0;
    const float lowest = std::bit_cast<float>((b << 16) | (negative ? 0xFFFFu : 0u));
    const float highest = std::bit_cast<float>((b << 16) | (negative ? 0u : 0xFFFFu));
    c.start[b] = static_cast<uint8_t>(below(lowest));
    // encode() steps over one midpoint at most: the codes' gaps are wider than a bucket
    // (2^-7 of its value) everywhere in [-1, 1].
    if (std::fabs(highest) <= 1.0f &&
        below(highest) + (c.midpoints[below(highest)] == highest) > c.start[b] + size_t{1}) {
      throw std::logic_error(fmt::format("moment code: bucket {:#x} holds two midpoints", b));
    }
  }
  return c;
}

const Code& code(bool is_signed) {
  static const Code signed_code = make_code(true);
  static const Code unsigned_code = make_code(false);
  return is_signed ? signed_code : unsigned_code;
}

// The number of midpoints below y: the bucket's count, plus one if y is past the one
// midpoint the bucket may hold.
uint8_t encode(const Code& c, float y) {
  const unsigned i = c.start[std::bit_cast<uint32_t>(y) >> 16];
  return static_cast<uint8_t>(i + (c.midpoints[i] < y ? 1u : 0u));
}

// max |x|: the largest of the magnitudes' bit patterns, which order as the magnitudes do (a
// NaN's is larger than any number's, so a NaN block keeps a NaN scale), as an integer
// reduction the compiler vectorizes.
float abs_max(std::span<const float> x) {
  uint32_t m = 0;
  for (float e : x) m = std::max(m, std::bit_cast<uint32_t>(e) & 0x7FFFFFFFu);
  return std::bit_cast<float>(m);
}

float quantize_block(const Code& c, std::span<const float> x, uint8_t* codes) {
  const float absmax = abs_max(x);
  if (absmax == 0) {
    // Decodes to zeros whatever the codes: the scale is 0.
    std::fill(codes, codes + x.size(), uint8_t{0});
    return 0;
  }
  // One reciprocal per block: a multiply per element, the same bits on every CPU.
  const float inverse = 1.0f / absmax;
  for (size_t i = 0; i < x.size(); ++i) codes[i] = encode(c, x[i] * inverse);
  return absmax;
}

void dequantize_block(const Code& c, const uint8_t* codes, float scale, std::span<float> out) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = c.values[codes[i]] * scale;
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

// Calls f(begin, end, block) for each block of a run of `count` elements.
template <typename F>
void for_each_block(size_t count, size_t first, F f) {
  for (size_t b = 0, k = 0; b < count; ++k) {
    const size_t e = std::min(count, k == 0 ? first : b + kMomentBlock);
    f(b, e, k);
    b = e;
  }
}

}  // namespace

std::span<const float> moment_code(bool is_signed) { return code(is_signed).values; }

uint8_t encode_moment(float normalized, bool is_signed) {
  return encode(code(is_signed), normalized);
}

float quantize_moment_block(std::span<const float> x, bool is_signed, uint8_t* codes) {
  return quantize_block(code(is_signed), x, codes);
}

void dequantize_moment_block(const uint8_t* codes, float scale, bool is_signed,
                             std::span<float> out) {
  dequantize_block(code(is_signed), codes, scale, out);
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
                           size_t first, bool is_signed, std::span<float> out) {
  if (codes.size() != out.size() || scales.size() != moment_blocks(out.size(), first)) {
    throw InvalidArgument(
        fmt::format("int8 moments: a run of {} elements got {} codes and {} scales", out.size(),
                    codes.size(), scales.size()));
  }
  const Code& c = code(is_signed);
  for_each_block(out.size(), first, [&](size_t b, size_t e, size_t k) {
    dequantize_block(c, codes.data() + b, scales[k], out.subspan(b, e - b));
  });
}

void dequantize_moments(const QuantizedMoments& q, std::span<float> m, std::span<float> v) {
  check_run(q, m.size());
  const Code& sc = code(true);
  const Code& uc = code(false);
  for_each_block(m.size(), q.first, [&](size_t b, size_t e, size_t k) {
    dequantize_block(sc, q.m.data() + b, q.m_scale[k], m.subspan(b, e - b));
    dequantize_block(uc, q.v.data() + b, q.v_scale[k], v.subspan(b, e - b));
  });
}

void quantize_moments(std::span<const float> m, std::span<const float> v,
                      const QuantizedMoments& q) {
  check_run(q, m.size());
  const Code& sc = code(true);
  const Code& uc = code(false);
  for_each_block(m.size(), q.first, [&](size_t b, size_t e, size_t k) {
    q.m_scale[k] = quantize_block(sc, m.subspan(b, e - b), q.m.data() + b);
    q.v_scale[k] = quantize_block(uc, v.subspan(b, e - b), q.v.data() + b);
  });
}

void adamw8_update(std::span<float> master, std::span<const float> grad, const QuantizedMoments& q,
                   bool decay, const AdamWConfig& config, int64_t step, float grad_scale) {
  check_run(q, master.size());
  if (grad.size() != master.size()) {
    throw InvalidArgument(fmt::format("int8 moments: {} gradients for {} master weights",
                                      grad.size(), master.size()));
  }
  // Chunks of whole blocks: decoded into fp32, updated by one call of the fp32 kernel (its
  // coefficients computed once per chunk), encoded back.
  constexpr size_t kChunkBlocks = 16;
  std::array<float, kChunkBlocks * kMomentBlock> m, v;
  const size_t n = master.size();
  const size_t blocks = moment_blocks(n, q.first);
  const auto block_begin = [&](size_t k) {
    return k == 0 ? 0 : std::min(n, q.first + (k - 1) * kMomentBlock);
  };
  for (size_t k0 = 0; k0 < blocks; k0 += kChunkBlocks) {
    const size_t k1 = std::min(blocks, k0 + kChunkBlocks);
    const size_t b = block_begin(k0), e = block_begin(k1);
    const std::span<float> mc(m.data(), e - b), vc(v.data(), e - b);
    const QuantizedMoments part{q.m.subspan(b, e - b), q.v.subspan(b, e - b),
                                q.m_scale.subspan(k0, k1 - k0), q.v_scale.subspan(k0, k1 - k0),
                                k0 == 0 ? q.first : kMomentBlock};
    dequantize_moments(part, mc, vc);
    adamw_update(
        {.master = master.subspan(b, e - b), .m = mc, .v = vc, .grad = grad.subspan(b, e - b)},
        decay, config, step, grad_scale);
    quantize_moments(mc, vc, part);
  }
}

}  // namespace zerodp
