// 8-bit Adam moments (optim/moments8.h): the codes' values and names, nearest-value encoding
// checked by brute force, the vectorized block loops against a scalar reference over a sweep
// of [-1, 1], the error a block keeps, the unsigned code's missing zero, the legacy decades
// code's values, block-split invariance of the update, and an update that tracks fp32 AdamW.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "optim/adamw.h"
#include "optim/moments8.h"

namespace zerodp {
namespace {

// The first byte encoding gives: m's byte 0 (-1.0625) lies past -1, where nothing is.
size_t lowest_code(bool is_signed) { return is_signed ? 1 : 0; }

// The byte of the value nearest y by brute force over every value encoding may give, on a
// tie the one of larger magnitude. Distances in double: exact wherever a tie can be (y within
// a factor 2 of both).
uint8_t nearest(std::span<const float> code, float y, bool is_signed) {
  size_t best = lowest_code(is_signed);
  double best_distance = INFINITY;
  for (size_t i = best; i < code.size(); ++i) {
    const double d = std::fabs(static_cast<double>(code[i]) - y);
    if (d < best_distance || (d == best_distance && std::fabs(code[i]) > std::fabs(code[best]))) {
      best = i;
      best_distance = d;
    }
  }
  return static_cast<uint8_t>(best);
}

// The same by a binary search of the ascending values: the scalar reference the vectorized
// loops are compared with over millions of inputs.
uint8_t reference_encode(std::span<const float> code, float y, bool is_signed) {
  const auto begin = code.begin() + static_cast<std::ptrdiff_t>(lowest_code(is_signed));
  const auto above = std::lower_bound(begin, code.end(), y);
  if (above == begin) return static_cast<uint8_t>(lowest_code(is_signed));
  if (above == code.end()) return 255;
  const size_t hi = static_cast<size_t>(above - code.begin()), lo = hi - 1;
  const double up = static_cast<double>(code[hi]) - y, down = y - static_cast<double>(code[lo]);
  if (up != down) return static_cast<uint8_t>(up < down ? hi : lo);
  return static_cast<uint8_t>(std::fabs(code[hi]) > std::fabs(code[lo]) ? hi : lo);
}

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

TEST(Moments8, TheCurrentCodeIsTheFloat8OneAndEveryCodeHasAStableName) {
  EXPECT_EQ(kCurrentMomentCode, MomentCode::kFloat8);
  EXPECT_EQ(moment_code_name(MomentCode::kDecades), "decades");
  EXPECT_EQ(moment_code_name(MomentCode::kFloat8), "e3m4/ue4m4");
  for (MomentCode c : {MomentCode::kDecades, MomentCode::kFloat8}) {
    EXPECT_EQ(parse_moment_code(moment_code_name(c)), c);
  }
  EXPECT_EQ(parse_moment_code("e4m3"), std::nullopt);
  EXPECT_EQ(parse_moment_code(""), std::nullopt);
}

TEST(Moments8, CodesAreMonotoneWithTheValuesTheyPromise) {
  for (MomentCode code : {MomentCode::kFloat8, MomentCode::kDecades}) {
    for (bool is_signed : {true, false}) {
      const std::span<const float> c = moment_code(is_signed, code);
      ASSERT_EQ(c.size(), 256u);
      for (size_t i = 1; i < c.size(); ++i) EXPECT_LT(c[i - 1], c[i]) << i;
      EXPECT_EQ(c.back(), 1.0f);
    }
  }
  const std::span<const float> m = moment_code(true), v = moment_code(false);
  // m: 0 and +-1 exact; byte 128 + c is +value(c), 128 - c is -value(c); value(c), c >= 1, is
  // a float with 4 mantissa bits from 2^-8 * 1.125 to 1; byte 0 (-1.0625) is never encoded.
  EXPECT_EQ(m[128], 0.0f);
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_EQ(m[1], -1.0f);
  EXPECT_EQ(m[0], -1.0625f);
  EXPECT_EQ(m[129], std::ldexp(1.125f, -8));
  EXPECT_EQ(m[254], 0.96875f);
  EXPECT_EQ(m[239], 0.5f);
  for (size_t c = 1; c < 128; ++c) EXPECT_EQ(m[128 - c], -m[128 + c]) << c;
  EXPECT_EQ(encode_moment(0.0f, true), 128);
  EXPECT_EQ(encode_moment(-0.0f, true), 128);
  EXPECT_EQ(encode_moment(1.0f, true), 255);
  EXPECT_EQ(encode_moment(-1.0f, true), 1);
  // v: no zero; 2^-16 * 1.0625 to 1, 16 values per binade.
  EXPECT_EQ(v[0], std::ldexp(1.0625f, -16)) << "the second moment's code has no zero";
  EXPECT_EQ(v[15], std::ldexp(1.0f, -15));
  EXPECT_EQ(v[254], 0.96875f);
  EXPECT_EQ(encode_moment(1.0f, false), 255);
  for (size_t i = 0; i < 256; ++i) {
    for (bool is_signed : {true, false}) {
      const float x = (is_signed ? m : v)[i];
      // Every value is a float of at most 5 significant bits (the 4 mantissa bits).
      EXPECT_EQ(std::bit_cast<uint32_t>(x) & 0x7FFFFu, 0u) << i;
    }
  }
}

TEST(Moments8, EncodingPicksTheNearestValue) {
  std::mt19937 rng(7);
  for (bool is_signed : {true, false}) {
    const std::span<const float> c = moment_code(is_signed);
    std::vector<float> ys;
    // Every value, every midpoint (the ties) and its neighbours, the flush of m's smallest
    // magnitude, values of every binade and below, and past 1.
    for (size_t i = lowest_code(is_signed); i < c.size(); ++i) {
      ys.push_back(c[i]);
      if (i > lowest_code(is_signed)) {
        const float mid = static_cast<float>((static_cast<double>(c[i - 1]) + c[i]) / 2);
        ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(c[i - 1]) + c[i]) / 2);
        ys.insert(ys.end(), {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f)});
      }
    }
    std::uniform_real_distribution<float> exponent(-24, 0), sign(-1, 1);
    for (int i = 0; i < 20000; ++i) {
      const float y = std::exp2(exponent(rng));
      ys.push_back(sign(rng) < 0 ? -y : y);
    }
    ys.insert(ys.end(),
              {0.0f, -0.0f, 1.0f, -1.0f, std::nextafter(1.0f, 2.0f), std::nextafter(-1.0f, -2.0f),
               std::ldexp(1.0f, -40), 1e-30f, std::numeric_limits<float>::denorm_min()});
    for (float y : ys) {
      if (!is_signed && std::signbit(y)) {
        // v is never negative; a negative y goes to the smallest value, as a tiny one does.
        ASSERT_EQ(encode_moment(y, false), 0) << y;
        continue;
      }
      ASSERT_EQ(encode_moment(y, is_signed), nearest(c, y, is_signed))
          << (is_signed ? "m " : "v ") << std::hexfloat << y;
    }
    // Past +-1 (x * fp32(1 / absmax) may round a little past it) the code stops at +-1: m's
    // byte 0 is never encoded.
    for (float y : {1.5f, 1e30f, INFINITY}) {
      EXPECT_EQ(encode_moment(y, is_signed), 255) << y;
      if (is_signed) {
        EXPECT_EQ(encode_moment(-y, true), 1) << -y;
      }
    }
  }
}

// Blocks whose first element is 1, so that x / absmax = x exactly and the block loops see
// the values given; `xs` fills the rest.
std::vector<float> blocks_led_by_one(const std::vector<float>& xs) {
  std::vector<float> out;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (out.size() % kMomentBlock == 0) out.push_back(1.0f);
    out.push_back(xs[i]);
  }
  return out;
}

// The block loops (vectorized, one target clone of several chosen for this CPU) give the
// scalar reference's bytes: every 4099th float of [0, 1] of either sign, the ends of every
// code interval, and random bit patterns in [-1, 1].
TEST(Moments8, TheVectorizedBlockLoopsGiveTheScalarReferencesBits) {
  std::mt19937 rng(17);
  for (bool is_signed : {true, false}) {
    const std::span<const float> c = moment_code(is_signed);
    std::vector<float> xs;
    for (uint32_t b = 0; b <= 0x3F800000u; b += 4099) {
      xs.push_back(from_bits(b));
      if (is_signed) xs.push_back(-from_bits(b));
    }
    for (size_t i = lowest_code(is_signed) + 1; i < c.size(); ++i) {
      const float mid = static_cast<float>((static_cast<double>(c[i - 1]) + c[i]) / 2);
      for (float y : {c[i], mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f)}) {
        if (is_signed || y >= 0) xs.push_back(y);
      }
    }
    std::uniform_int_distribution<uint32_t> bits(0, 0x3F800000u), coin(0, 1);
    for (int i = 0; i < 100000; ++i) {
      const float y = from_bits(bits(rng));
      xs.push_back(is_signed && coin(rng) ? -y : y);
    }
    const std::vector<float> x = blocks_led_by_one(xs);
    std::vector<uint8_t> codes(x.size());
    std::vector<float> decoded(x.size());
    for (size_t b = 0; b < x.size(); b += kMomentBlock) {
      const size_t n = std::min(kMomentBlock, x.size() - b);
      const std::span<const float> block(x.data() + b, n);
      ASSERT_EQ(quantize_moment_block(block, is_signed, codes.data() + b), 1.0f);
      dequantize_moment_block(codes.data() + b, 1.0f, is_signed, std::span(decoded).subspan(b, n));
    }
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(codes[i], reference_encode(c, x[i], is_signed))
          << (is_signed ? "m " : "v ") << std::hexfloat << x[i];
      ASSERT_EQ(codes[i], encode_moment(x[i], is_signed)) << std::hexfloat << x[i];
      ASSERT_EQ(decoded[i], c[codes[i]]) << i;
    }
  }
}

// Runs of both moments with a short first block and a short last one (lengths that are not a
// multiple of any vector width), random scales: the codes are the scalar reference's for
// x * fp32(1 / absmax), and the decoded values are value * scale.
TEST(Moments8, RunsOfBothMomentsGiveTheScalarReferencesBits) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-30, 5);
  const size_t n = 1000, first = 37;
  std::vector<float> m(n), v(n), m_out(n), v_out(n);
  std::vector<uint8_t> mc(n), vc(n);
  std::vector<float> ms(moment_blocks(n, first)), vs(ms.size());
  const QuantizedMoments q{mc, vc, ms, vs, first};
  for (int round = 0; round < 20; ++round) {
    for (size_t i = 0; i < n; ++i) {
      const float scale = std::exp2(exponent(rng));
      m[i] = normal(rng) * scale;
      v[i] = m[i] * m[i] * std::exp2(exponent(rng) / 4);
    }
    if (round == 0) std::fill(m.begin() + first, m.begin() + first + kMomentBlock, 0.0f);
    quantize_moments(m, v, q);
    dequantize_moments(q, m_out, v_out);
    size_t b = 0;
    for (size_t k = 0; k < ms.size(); ++k) {
      const size_t e = std::min(n, k == 0 ? first : b + kMomentBlock);
      for (bool is_signed : {true, false}) {
        const std::vector<float>& x = is_signed ? m : v;
        float absmax = 0;
        for (size_t i = b; i < e; ++i) absmax = std::max(absmax, std::fabs(x[i]));
        const float scale = (is_signed ? ms : vs)[k];
        ASSERT_EQ(scale, absmax) << k;
        const float inverse = absmax == 0 ? 0.0f : 1.0f / absmax;
        const std::span<const float> c = moment_code(is_signed);
        for (size_t i = b; i < e; ++i) {
          const uint8_t code = (is_signed ? mc : vc)[i];
          ASSERT_EQ(code, reference_encode(c, x[i] * inverse, is_signed)) << round << " " << i;
          ASSERT_EQ((is_signed ? m_out : v_out)[i], c[code] * scale) << i;
        }
      }
      b = e;
    }
  }
}

TEST(Moments8, ABlockKeepsEveryElementWithinHalfAStepOfItself) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> m(kMomentBlock), v(kMomentBlock), out(kMomentBlock);
  std::vector<uint8_t> codes(kMomentBlock);
  for (float& x : m) x = normal(rng) * 1e-3f;
  for (float& x : v) x = normal(rng) * normal(rng) * 1e-6f;
  for (float& x : v) x = x * x;
  for (bool is_signed : {true, false}) {
    const std::vector<float>& x = is_signed ? m : v;
    const float scale = quantize_moment_block(x, is_signed, codes.data());
    float absmax = 0;
    for (float e : x) absmax = std::max(absmax, std::fabs(e));
    EXPECT_EQ(scale, absmax);
    dequantize_moment_block(codes.data(), scale, is_signed, out);
    // The largest element is exact.
    const size_t top = static_cast<size_t>(
        std::max_element(x.begin(), x.end(),
                         [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
        x.begin());
    EXPECT_EQ(out[top], x[top]);
    // Half a step of 4 mantissa bits (1/32 of the binade's bottom), plus the two roundings of
    // the scaling, down to the smallest value; below it m flushes to 0 and v stops there.
    const float least = absmax * (is_signed ? std::ldexp(1.125f, -8) : std::ldexp(1.0625f, -16));
    for (size_t i = 0; i < x.size(); ++i) {
      const float a = std::fabs(x[i]);
      if (a >= least) {
        EXPECT_LE(std::fabs(out[i] - x[i]), a * (1.0f / 32 + 1e-6f)) << i << " " << x[i];
      } else if (is_signed) {
        EXPECT_LE(std::fabs(out[i]), 2 * a) << i;
      } else {
        EXPECT_GE(out[i], x[i]) << i;
        EXPECT_LE(out[i], least * (1 + 1e-6f)) << i;
      }
    }
  }
}

TEST(Moments8, ASecondMomentDecodesToZeroOnlyInAnAllZeroBlock) {
  std::vector<float> v(kMomentBlock, 0.0f), out(kMomentBlock);
  std::vector<uint8_t> codes(kMomentBlock);
  v[5] = 1.0f;  // the rest are 0, far below 2^-16 of it
  v[6] = 1e-30f;
  float scale = quantize_moment_block(v, false, codes.data());
  dequantize_moment_block(codes.data(), scale, false, out);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_GT(out[i], 0.0f) << i;
    EXPECT_EQ(out[i], i == 5 ? 1.0f : std::ldexp(1.0625f, -16)) << i;
  }
  std::fill(v.begin(), v.end(), 0.0f);
  v[9] = -0.0f;
  scale = quantize_moment_block(v, false, codes.data());
  EXPECT_EQ(std::bit_cast<uint32_t>(scale), 0u);
  dequantize_moment_block(codes.data(), scale, false, out);
  for (float x : out) EXPECT_EQ(x, 0.0f);
  // m too: scale 0, codes of 0.
  scale = quantize_moment_block(v, true, codes.data());
  EXPECT_EQ(std::bit_cast<uint32_t>(scale), 0u);
  for (uint8_t c : codes) EXPECT_EQ(c, encode_moment(0.0f, true));
}

// Checkpoints written in the decades code decode to its values: pinned from the table as it
// was when they were written.
TEST(Moments8, TheLegacyDecadesCodeDecodesToItsOldValues) {
  const std::span<const float> m = moment_code(true, MomentCode::kDecades);
  const std::span<const float> v = moment_code(false, MomentCode::kDecades);
  EXPECT_EQ(m[0], -1.0f);
  EXPECT_EQ(m[1], -0x1.fc6666p-1f);
  EXPECT_EQ(m[64], -0x1.b66666p-4f);
  EXPECT_EQ(m[127], 0.0f);
  EXPECT_EQ(m[128], static_cast<float>(std::pow(10.0, -6) * 0.55));
  EXPECT_EQ(m[128], 0x1.27476cp-21f);
  EXPECT_EQ(m[129], 0x1.b43526p-19f);
  EXPECT_EQ(m[200], 0x1.de6666p-3f);
  EXPECT_EQ(m[254], 0x1.fc6666p-1f);
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_EQ(v[0], static_cast<float>(1e-7));
  EXPECT_EQ(v[1], 0x1.5cf752p-22f);
  EXPECT_EQ(v[64], 0x1.8cccccp-7f);
  EXPECT_EQ(v[128], 0x1.c4ccccp-4f);
  EXPECT_EQ(v[200], 0x1.3bccccp-1f);
  EXPECT_EQ(v[254], 0x1.fe3334p-1f);
  EXPECT_EQ(v[255], 1.0f);
  // A run of two blocks (the first 3 long) decodes to value * its block's scale.
  const std::vector<uint8_t> codes = {0, 127, 255, 1, 64, 128, 200, 254};
  const std::vector<float> scales = {2.0f, 0.5f};
  for (bool is_signed : {true, false}) {
    const std::span<const float> c = is_signed ? m : v;
    std::vector<float> out(codes.size());
    dequantize_moment_run(codes, scales, 3, is_signed, out, MomentCode::kDecades);
    for (size_t i = 0; i < codes.size(); ++i) {
      EXPECT_EQ(out[i], c[codes[i]] * scales[i < 3 ? 0 : 1]) << i;
    }
    // The default is the current code.
    dequantize_moment_run(codes, scales, 3, is_signed, out);
    EXPECT_EQ(out[2], 2.0f);
    EXPECT_EQ(out[3], moment_code(is_signed)[1] * 0.5f);
  }
}

TEST(Moments8, BlockCountsFollowTheGrid) {
  EXPECT_EQ(moment_blocks(0, 256), 0u);
  EXPECT_EQ(moment_blocks(10, 256), 1u);
  EXPECT_EQ(moment_blocks(256, 256), 1u);
  EXPECT_EQ(moment_blocks(257, 256), 2u);
  EXPECT_EQ(moment_blocks(300, 44), 2u);  // 44 + 256
  EXPECT_EQ(moment_blocks(301, 44), 3u);
  EXPECT_THROW((void)moment_blocks(10, 0), std::exception);
  EXPECT_THROW((void)moment_blocks(10, 257), std::exception);
}

// A run's moments and master, and its update as one call or as two runs split at a block
// boundary.
struct MomentRun {
  std::vector<float> master, grad;
  std::vector<uint8_t> m, v;
  std::vector<float> ms, vs;
  size_t first;
  MomentRun(size_t n, size_t first_block, uint32_t seed) : first(first_block) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    for (size_t i = 0; i < n; ++i) master.push_back(normal(rng) * 0.02f);
    grad.resize(n);
    m.assign(n, 0);
    v.assign(n, 0);
    ms.assign(moment_blocks(n, first), 0.0f);
    vs.assign(ms.size(), 0.0f);
  }
  QuantizedMoments q(size_t b, size_t n, size_t block0, size_t first_block) {
    return {std::span(m).subspan(b, n), std::span(v).subspan(b, n),
            std::span(ms).subspan(block0, moment_blocks(n, first_block)),
            std::span(vs).subspan(block0, moment_blocks(n, first_block)), first_block};
  }
};

TEST(Moments8, AnUpdateSplitAtBlockBoundariesGivesTheSameBits) {
  // Several of the update's chunks long, so that the cuts fall inside chunks.
  const size_t n = 3000, first = 100;
  MomentRun whole(n, first, 1), split(n, first, 1);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const AdamWConfig c;
  for (int step = 1; step <= 5; ++step) {
    for (float& g : whole.grad) g = normal(rng) * (step == 3 ? 0 : 1);
    split.grad = whole.grad;
    adamw8_update(whole.master, whole.grad, whole.q(0, n, 0, first), true, c, step, 0.5f);
    // [0, 356): the first block and one whole one; [356, 1380) four; the rest.
    const size_t cut = first + kMomentBlock, cut2 = cut + 4 * kMomentBlock;
    adamw8_update(std::span(split.master).first(cut), std::span(split.grad).first(cut),
                  split.q(0, cut, 0, first), true, c, step, 0.5f);
    adamw8_update(std::span(split.master).subspan(cut, cut2 - cut),
                  std::span(split.grad).subspan(cut, cut2 - cut),
                  split.q(cut, cut2 - cut, 2, kMomentBlock), true, c, step, 0.5f);
    adamw8_update(std::span(split.master).subspan(cut2), std::span(split.grad).subspan(cut2),
                  split.q(cut2, n - cut2, 6, kMomentBlock), true, c, step, 0.5f);
    EXPECT_EQ(whole.master, split.master) << "step " << step;
    EXPECT_EQ(whole.m, split.m);
    EXPECT_EQ(whole.v, split.v);
    EXPECT_EQ(whole.ms, split.ms);
    EXPECT_EQ(whole.vs, split.vs);
  }
}

// The update is decode, the fp32 kernel, encode: the same bits as those three calls on the
// whole run.
TEST(Moments8, AnUpdateIsDecodeTheFp32KernelAndEncode) {
  const size_t n = 2500, first = 200;
  MomentRun fused(n, first, 2);
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  const AdamWConfig c;
  for (int step = 1; step <= 4; ++step) {
    for (float& g : fused.grad) g = normal(rng) * (1.0f + static_cast<float>(step));
    std::vector<float> master = fused.master, m(n), v(n);
    std::vector<uint8_t> mc = fused.m, vc = fused.v;
    std::vector<float> ms = fused.ms, vs = fused.vs;
    const QuantizedMoments q{mc, vc, ms, vs, first};
    dequantize_moments(q, m, v);
    portable::adamw_update({.master = master, .m = m, .v = v, .grad = fused.grad}, false, c, step,
                           0.25f);
    quantize_moments(m, v, q);
    adamw8_update(fused.master, fused.grad, fused.q(0, n, 0, first), false, c, step, 0.25f);
    EXPECT_EQ(fused.master, master) << "step " << step;
    EXPECT_EQ(fused.m, mc);
    EXPECT_EQ(fused.v, vc);
    EXPECT_EQ(fused.ms, ms);
    EXPECT_EQ(fused.vs, vs);
  }
}

// Same gradients: after 100 steps the 8-bit run's weights have moved as the fp32 run's did,
// to within a few percent of the distance travelled.
TEST(Moments8, TheUpdateTracksFp32AdamW) {
  const size_t n = 4096;
  MomentRun q8(n, kMomentBlock, 5);
  std::vector<float> master = q8.master, m(n, 0.0f), v(n, 0.0f);
  const std::vector<float> start = master;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  AdamWConfig c;
  c.lr = 1e-3;
  std::vector<float> noise(n);
  for (int step = 1; step <= 100; ++step) {
    // A pull towards 0 plus the same noise for both, each element its own scale.
    for (float& x : noise) x = 0.01f * normal(rng);
    for (size_t i = 0; i < n; ++i) {
      q8.grad[i] = master[i] * (1.0f + static_cast<float>(i % 7)) + noise[i];
    }
    adamw_update({.master = master, .m = m, .v = v, .grad = q8.grad}, true, c, step, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      q8.grad[i] = q8.master[i] * (1.0f + static_cast<float>(i % 7)) + noise[i];
    }
    adamw8_update(q8.master, q8.grad, q8.q(0, n, 0, kMomentBlock), true, c, step, 1.0f);
  }
  double moved = 0, apart = 0;
  for (size_t i = 0; i < n; ++i) {
    moved += std::pow(static_cast<double>(master[i]) - start[i], 2);
    apart += std::pow(static_cast<double>(master[i]) - q8.master[i], 2);
  }
  EXPECT_LT(std::sqrt(apart), 0.05 * std::sqrt(moved))
      << "8-bit " << std::sqrt(apart) << " apart of " << std::sqrt(moved) << " moved";
}

}  // namespace
}  // namespace zerodp
