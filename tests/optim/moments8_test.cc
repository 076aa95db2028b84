// 8-bit Adam moments (optim/moments8.h): the codes, nearest-value encoding, the error a block
// keeps, the unsigned code's missing zero, block-split invariance of the update, and an
// update that tracks fp32 AdamW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "optim/adamw.h"
#include "optim/moments8.h"

namespace zerodp {
namespace {

// The index of the nearest value, the lower on a tie, by brute force.
uint8_t nearest(std::span<const float> code, float y) {
  size_t best = 0;
  for (size_t i = 1; i < code.size(); ++i) {
    const float mid = static_cast<float>((static_cast<double>(code[i - 1]) + code[i]) / 2);
    if (mid < y) best = i;
  }
  return static_cast<uint8_t>(best);
}

TEST(Moments8, CodesAreAscendingWithTheValuesTheyPromise) {
  for (bool is_signed : {true, false}) {
    const std::span<const float> c = moment_code(is_signed);
    ASSERT_EQ(c.size(), 256u);
    for (size_t i = 1; i < c.size(); ++i) EXPECT_LT(c[i - 1], c[i]) << i;
    EXPECT_EQ(c.back(), 1.0f);
    if (is_signed) {
      EXPECT_EQ(c.front(), -1.0f);
      EXPECT_NE(std::find(c.begin(), c.end(), 0.0f), c.end());
    } else {
      EXPECT_EQ(c.front(), 1e-7f) << "the second moment's code has no zero";
    }
  }
}

TEST(Moments8, EncodingPicksTheNearestValue) {
  std::mt19937 rng(7);
  for (bool is_signed : {true, false}) {
    const std::span<const float> c = moment_code(is_signed);
    std::vector<float> ys;
    // Every value, every midpoint and its neighbours, and values of every decade.
    for (size_t i = 0; i < c.size(); ++i) {
      ys.push_back(c[i]);
      if (i > 0) {
        const float mid = static_cast<float>((static_cast<double>(c[i - 1]) + c[i]) / 2);
        ys.insert(ys.end(), {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f)});
      }
    }
    std::uniform_real_distribution<float> exponent(-9, 0), sign(-1, 1);
    for (int i = 0; i < 20000; ++i) {
      const float y = std::pow(10.0f, exponent(rng));
      ys.push_back(is_signed && sign(rng) < 0 ? -y : y);
    }
    ys.insert(ys.end(), {0.0f, -0.0f, 1.0f});
    for (float y : ys) {
      if (!is_signed && y < 0) continue;
      ASSERT_EQ(encode_moment(y, is_signed), nearest(c, y)) << (is_signed ? "m " : "v ") << y;
    }
  }
}

TEST(Moments8, ABlockKeepsItsLargeElementsCloseAndSmallOnesRelative) {
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
    for (size_t i = 0; i < x.size(); ++i) {
      // Within half the widest gap of the top decade: 0.9/64/2 (signed), 0.9/128/2.
      EXPECT_LE(std::fabs(out[i] - x[i]), absmax * (is_signed ? 0.0071f : 0.0036f)) << i;
      // Down to 10^-2 of the block's largest, within 15 % of itself (the decade's grid is
      // coarser further down: 2^i values in decade i).
      if (std::fabs(x[i]) > 1e-2f * absmax) {
        EXPECT_LE(std::fabs(out[i] - x[i]), 0.15f * std::fabs(x[i])) << i << " " << x[i];
      }
    }
  }
}

TEST(Moments8, ASecondMomentDecodesToZeroOnlyInAnAllZeroBlock) {
  std::vector<float> v(kMomentBlock, 0.0f), out(kMomentBlock);
  std::vector<uint8_t> codes(kMomentBlock);
  v[5] = 1.0f;  // the rest are 0, far below 10^-7 of it
  float scale = quantize_moment_block(v, false, codes.data());
  dequantize_moment_block(codes.data(), scale, false, out);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_GT(out[i], 0.0f) << i;
    EXPECT_LE(out[i], i == 5 ? 1.0f : 1e-7f) << i;
  }
  std::fill(v.begin(), v.end(), 0.0f);
  scale = quantize_moment_block(v, false, codes.data());
  EXPECT_EQ(scale, 0.0f);
  dequantize_moment_block(codes.data(), scale, false, out);
  for (float x : out) EXPECT_EQ(x, 0.0f);
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
  const size_t n = 1000, first = 100;
  MomentRun whole(n, first, 1), split(n, first, 1);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const AdamWConfig c;
  for (int step = 1; step <= 5; ++step) {
    for (float& g : whole.grad) g = normal(rng) * (step == 3 ? 0 : 1);
    split.grad = whole.grad;
    adamw8_update(whole.master, whole.grad, whole.q(0, n, 0, first), true, c, step, 0.5f);
    // [0, 356): the first block and one whole one; [356, 1000) starts on the grid.
    const size_t cut = first + kMomentBlock;
    adamw8_update(std::span(split.master).first(cut), std::span(split.grad).first(cut),
                  split.q(0, cut, 0, first), true, c, step, 0.5f);
    adamw8_update(std::span(split.master).subspan(cut), std::span(split.grad).subspan(cut),
                  split.q(cut, n - cut, 2, kMomentBlock), true, c, step, 0.5f);
    EXPECT_EQ(whole.master, split.master) << "step " << step;
    EXPECT_EQ(whole.m, split.m);
    EXPECT_EQ(whole.v, split.v);
    EXPECT_EQ(whole.ms, split.ms);
    EXPECT_EQ(whole.vs, split.vs);
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
