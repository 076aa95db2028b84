#include "optim/grad_clip.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"

namespace zerodp {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& xi : x) xi = normal(rng) * std::pow(10.0f, normal(rng));
  return x;
}

// The documented order, written out plainly.
double documented_order(std::span<const float> x) {
  double lane[16] = {};
  const size_t full = x.size() / 16 * 16;
  for (size_t i = 0; i < full; ++i) {
    lane[i % 16] += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  for (size_t k = 0; k < 8; ++k) lane[k] += lane[k + 8];
  for (size_t k = 0; k < 4; ++k) lane[k] += lane[k + 4];
  for (size_t k = 0; k < 2; ++k) lane[k] += lane[k + 2];
  lane[0] += lane[1];
  double sum = lane[0];
  for (size_t i = full; i < x.size(); ++i) {
    sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  return sum;
}

TEST(SumOfSquares, EmptyIsZero) { EXPECT_EQ(sum_of_squares({}), 0.0); }

TEST(SumOfSquares, IsExactOnSmallIntegers) {
  std::vector<float> x(100);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i + 1);
  EXPECT_EQ(sum_of_squares(x), 338350.0);  // n(n+1)(2n+1)/6
}

TEST(SumOfSquares, FollowsTheDocumentedOrderBitForBit) {
  for (const size_t n : {1u, 15u, 16u, 17u, 31u, 32u, 1000u, 100003u}) {
    const auto x = random_values(n, static_cast<uint32_t>(n));
    EXPECT_EQ(std::bit_cast<uint64_t>(sum_of_squares(x)),
              std::bit_cast<uint64_t>(documented_order(x)))
        << "n " << n;
  }
}

TEST(SumOfSquares, DependsOnContentsNotOnAddress) {
  const auto x = random_values(4099, 9);
  std::vector<float> shifted(x.size() + 3);
  std::copy(x.begin(), x.end(), shifted.begin() + 3);
  EXPECT_EQ(std::bit_cast<uint64_t>(sum_of_squares(x)),
            std::bit_cast<uint64_t>(sum_of_squares(std::span(shifted).subspan(3))));
}

TEST(SumOfSquares, IsCloseToALongDoubleSum) {
  const auto x = random_values(1 << 20, 11);
  long double want = 0;
  for (const float xi : x) want += static_cast<long double>(xi) * xi;
  EXPECT_NEAR(sum_of_squares(x) / static_cast<double>(want), 1.0, 1e-14);
}

TEST(SumOfSquares, NonFiniteInputsGiveNonFiniteSums) {
  std::vector<float> x(40, 1.0f);
  x[37] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(sum_of_squares(x)));
  x[3] = std::nanf("");
  EXPECT_TRUE(std::isnan(sum_of_squares(x)));
}

TEST(GradNorm, IsTheSquareRootOfTheGlobalSum) {
  EXPECT_EQ(grad_norm(25.0), 5.0);
  EXPECT_EQ(grad_norm(0.0), 0.0);
}

TEST(ClipCoefficient, ZeroMaxNormTurnsClippingOff) {
  EXPECT_EQ(clip_coefficient(1e30, 0.0), 1.0f);
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 0.0), 1.0f);
}

TEST(ClipCoefficient, IsOneWhenTheNormIsWellBelowTheLimit) {
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(1.0 - 1e-5, 1.0), 1.0f);
}

TEST(ClipCoefficient, IsMaxNormOverNormPlusOneMicroAsPyTorch) {
  // clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1.
  EXPECT_EQ(clip_coefficient(5.0, 1.0), static_cast<float>(1.0 / (5.0 + 1e-6)));
  EXPECT_EQ(clip_coefficient(1.0, 1.0), static_cast<float>(1.0 / (1.0 + 1e-6)));  // < 1
  EXPECT_LT(clip_coefficient(1.0, 1.0), 1.0f);
  EXPECT_EQ(clip_coefficient(40.0, 0.5), static_cast<float>(0.5 / (40.0 + 1e-6)));
  // torch 1.13.1: grads (3, 4), max_norm 1 -> the gradients become these (float.hex()).
  const float coef = clip_coefficient(grad_norm(25.0), 1.0);
  EXPECT_EQ(3.0f * coef, 0x1.33333p-1f);
  EXPECT_EQ(4.0f * coef, 0x1.999994p-1f);
}

TEST(ClipCoefficient, NonFiniteNormsGiveNaNOrZero) {
  EXPECT_TRUE(std::isnan(clip_coefficient(std::nan(""), 1.0)));
  EXPECT_EQ(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0), 0.0f);
}

TEST(ClipCoefficient, RejectsNegativeOrNonFiniteMaxNorm) {
  EXPECT_THROW((void)clip_coefficient(1.0, -1.0), InvalidArgument);
  EXPECT_THROW((void)clip_coefficient(1.0, std::numeric_limits<double>::infinity()),
               InvalidArgument);
  try {
    (void)clip_coefficient(1.0, -2.5);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("-2.5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zerodp
