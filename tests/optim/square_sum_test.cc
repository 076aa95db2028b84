#include "optim/square_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "optim/grad_clip.h"
#include "tensor/dtype.h"

namespace zerodp {
namespace {

__extension__ typedef unsigned __int128 U128;

// Σ x^2 in units of 2^-298 as normalized 32-bit limbs, one element at a time with the carry
// propagated at once: the definition, without the implementation's bins and tables.
std::vector<uint64_t> reference_limbs(std::span<const float> x) {
  std::vector<uint64_t> limbs(SquareSum::kLimbs, 0);
  for (float xi : x) {
    const uint32_t bits = std::bit_cast<uint32_t>(xi);
    uint32_t e = (bits >> 23) & 0xff;
    uint64_t m = bits & 0x7fffff;
    if (e == 0) {
      e = 1;
    } else {
      m |= uint64_t{1} << 23;
    }
    const uint32_t shift = 2 * e - 2;
    U128 add = U128{m * m} << (shift % 32);
    for (size_t i = shift / 32; i < limbs.size() && add != 0; ++i) {
      const U128 v = U128{limbs[i]} + (add & 0xffffffffu);
      limbs[i] = static_cast<uint64_t>(v & 0xffffffffu);
      add = (add >> 32) + (v >> 32);
    }
  }
  return limbs;
}

// The nearest double to an integer in units of 2^-298, by another route than value(): the top
// 64 bits with a sticky bit, converted by the hardware (round to nearest, the default mode).
double reference_value(const std::vector<uint64_t>& limbs) {
  size_t top = limbs.size();
  while (top > 0 && limbs[top - 1] == 0) --top;
  if (top == 0) return 0.0;
  U128 window = 0;
  int unit = 0;  // window's lowest bit is 2^(unit - 298)
  for (size_t i = top; i-- > 0;) {
    window = (window << 32) | limbs[i];
    unit = 32 * static_cast<int>(i);
    if (window >> 64 != 0) break;
  }
  bool sticky = false;
  for (size_t i = 0; i < static_cast<size_t>(unit / 32); ++i) sticky |= limbs[i] != 0;
  while (window >> 64 != 0) {
    sticky |= (window & 1) != 0;
    window >>= 1;
    ++unit;
  }
  const auto top64 = static_cast<uint64_t>(window) | (sticky ? 1 : 0);
  return std::ldexp(static_cast<double>(top64), unit - 298);
}

std::vector<uint64_t> limbs_of(const SquareSum& s) {
  const std::vector<double> d = s.to_doubles();
  std::vector<uint64_t> limbs(SquareSum::kLimbs);
  for (size_t i = 0; i < limbs.size(); ++i) limbs[i] = static_cast<uint64_t>(d[i]);
  return limbs;
}

double square_sum(std::span<const float> x) {
  SquareSum s;
  s.add(x);
  return s.value();
}

uint64_t bits_of(double d) { return std::bit_cast<uint64_t>(d); }

// Normal values times 2^k, k uniform in [k_min, k_max]: squares spread over most bins,
// subnormals included when k_min is low enough; always finite.
std::vector<float> wide_values(size_t n, uint32_t seed, int k_min = -140, int k_max = 120) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> k(k_min, k_max);
  std::vector<float> x(n);
  for (float& xi : x) {
    xi = std::ldexp(normal(rng), k(rng));
    if (std::isinf(xi)) xi = std::copysign(FLT_MAX, xi);  // k near 127 can overflow
  }
  return x;
}

TEST(SquareSum, EmptyAndZerosGivePositiveZero) {
  SquareSum s;
  EXPECT_EQ(bits_of(s.value()), bits_of(0.0));
  s.add(std::span<const float>{});
  const std::vector<float> zeros = {0.0f, -0.0f, 0.0f};
  s.add(zeros);
  EXPECT_EQ(bits_of(s.value()), bits_of(0.0));
  EXPECT_EQ(s, SquareSum{});
}

TEST(SquareSum, PowersOfTwoAndSmallIntegersAreExact) {
  const std::vector<float> x = {1.0f, -2.0f, 0.5f, 0x1p-20f, 3.0f, 0x1p100f};
  // 1 + 4 + 0.25 + 2^-40 + 9 + 2^200: the 2^-40 and 14.25 are lost below 2^200's ulp.
  EXPECT_EQ(square_sum(x), 0x1p200);
  const std::vector<float> small = {1.0f, -2.0f, 0.5f, 0x1p-20f, 3.0f};
  EXPECT_EQ(square_sum(small), 14.25 + 0x1p-40);
}

TEST(SquareSum, RandomFloatsNarrowRangeMatchLongDouble) {
  // Exponents within [0, 3] and at most 16 elements: every square is an integer below 2^54 in
  // units of 2^-46, the sum below 2^58, exact in a 64-bit long double; its conversion to double
  // rounds once, to nearest even.
  static_assert(std::numeric_limits<long double>::digits >= 64);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(1.0f, 16.0f);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> x(1 + trial % 16);
    long double exact = 0;
    for (float& xi : x) {
      xi = u(rng) * ((trial & 1) ? 0x1p-130f : 1.0f);  // also in the subnormal range
      exact += static_cast<long double>(xi) * static_cast<long double>(xi);
    }
    ASSERT_EQ(bits_of(square_sum(x)), bits_of(static_cast<double>(exact))) << "trial " << trial;
  }
}

TEST(SquareSum, RoundsTiesToEvenAndHonoursStickyBitsInLowLimbs) {
  const float big = 0x1p26f;  // big^2 = 2^52
  // 2^53 + 1: a tie between 2^53 and 2^53 + 2, to even.
  EXPECT_EQ(square_sum(std::vector<float>{big, big, 1.0f}), 0x1p53);
  // 2^53 + 3: a tie between 2^53 + 2 and 2^53 + 4, to even.
  EXPECT_EQ(square_sum(std::vector<float>{big, big, 1.0f, 1.0f, 1.0f}), 0x1p53 + 4);
  // 2^53 + 1 + 2^-240: just above the tie, the deciding bit far below, in another limb.
  EXPECT_EQ(square_sum(std::vector<float>{big, big, 1.0f, 0x1p-120f}), 0x1p53 + 2);
  // The smallest subnormal, squared, is the unit.
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(square_sum(std::vector<float>{tiny}), 0x1p-298);
  EXPECT_EQ(square_sum(std::vector<float>{tiny, -tiny, tiny}), 3 * 0x1p-298);
}

TEST(SquareSum, SubnormalsAreExact) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float sub = 0x1.fffffcp-127f;  // the largest subnormal: (2^23 - 1) * 2^-149
  ASSERT_EQ(std::fpclassify(sub), FP_SUBNORMAL);
  const float smallest_normal = FLT_MIN;
  // (2^23 - 1)^2 + 2^46 + 1 units of 2^-298, below 2^53: exact in a double.
  const double expected = (8388607.0 * 8388607.0 + 0x1p46 + 1) * 0x1p-298;
  EXPECT_EQ(square_sum(std::vector<float>{sub, smallest_normal, tiny}), expected);
}

TEST(SquareSum, LargestFloatSquaredIsExact) {
  const float max = FLT_MAX;  // its square has 48 significant bits: exact in a double
  const double square = static_cast<double>(max) * static_cast<double>(max);
  EXPECT_EQ(square_sum(std::vector<float>{max}), square);
  EXPECT_EQ(square_sum(std::vector<float>{-max, max}), 2 * square);
  // 1000 copies need 58 bits: a 64-bit long double holds them, its conversion rounds once.
  const std::vector<float> many(1000, max);
  const long double exact = 1000.0L * static_cast<long double>(square);
  EXPECT_EQ(bits_of(square_sum(many)), bits_of(static_cast<double>(exact)));
}

TEST(SquareSum, MatchesPerElementReferenceOverEveryExponent) {
  // Every exponent slot, with the full significand range, and the largest float.
  std::vector<float> x = wide_values(200000, 11, -150, 127);
  x.push_back(FLT_MAX);
  x.push_back(std::numeric_limits<float>::denorm_min());
  SquareSum s;
  s.add(x);
  const std::vector<uint64_t> ref = reference_limbs(x);
  EXPECT_EQ(limbs_of(s), ref);
  EXPECT_EQ(bits_of(s.value()), bits_of(reference_value(ref)));
}

TEST(SquareSum, ManyLargestSignificandsInOneBinDoNotOverflow) {
  // 2^24 - 1 is the largest significand: its square is the largest per-element addend, so any
  // table kept past 2^16 of them would wrap. Lengths around the chunk and table boundaries.
  const float x = 0x1.fffffep0f;
  for (size_t n : {size_t{65536}, size_t{262143}, size_t{262144}, size_t{262147}, size_t{1} << 20,
                   (size_t{1} << 20) + 5}) {
    const std::vector<float> v(n, x);
    SquareSum s;
    s.add(v);
    const std::vector<uint64_t> ref = reference_limbs(v);
    EXPECT_EQ(limbs_of(s), ref) << n << " elements";
    EXPECT_EQ(bits_of(s.value()), bits_of(reference_value(ref))) << n << " elements";
  }
}

// Splits [0, n) into `pieces` ranges at random boundaries (empty ranges allowed).
std::vector<size_t> random_cuts(size_t n, size_t pieces, std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> at(0, n);
  std::vector<size_t> cuts = {0, n};
  for (size_t i = 1; i < pieces; ++i) cuts.push_back(at(rng));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

TEST(SquareSum, AnySplitAndMergeOrderGivesTheSameBits) {
  const std::vector<float> x = wide_values(size_t{3} << 20, 2024);
  const std::span<const float> all(x);
  SquareSum whole;
  whole.add(all);
  const std::vector<double> expected = whole.to_doubles();
  ASSERT_GT(whole.value(), 0.0);
  ASSERT_TRUE(std::isfinite(whole.value()));

  std::mt19937_64 rng(99);
  std::set<uint64_t> double_sums;  // the same splits, summed in double as grad_clip does
  for (size_t pieces : {1, 2, 3, 7}) {
    for (int trial = 0; trial < 3; ++trial) {
      const std::vector<size_t> cuts = random_cuts(x.size(), pieces, rng);
      std::vector<SquareSum> partial(pieces);
      double rank_order = 0;
      for (size_t p = 0; p < pieces; ++p) {
        const auto piece = all.subspan(cuts[p], cuts[p + 1] - cuts[p]);
        partial[p].add(piece);
        rank_order += sum_of_squares(piece);
      }
      double_sums.insert(bits_of(rank_order));

      std::vector<size_t> order(pieces);
      std::iota(order.begin(), order.end(), 0);
      for (int shuffle = 0; shuffle < 3; ++shuffle) {
        // In rank order, then reversed, then shuffled; the last one through the exchange.
        if (shuffle == 1) std::reverse(order.begin(), order.end());
        if (shuffle == 2) std::shuffle(order.begin(), order.end(), rng);
        SquareSum merged;
        std::vector<double> gathered;
        for (size_t p : order) {
          merged.merge(partial[p]);
          const std::vector<double> d = partial[p].to_doubles();
          gathered.insert(gathered.end(), d.begin(), d.end());
        }
        EXPECT_EQ(merged.to_doubles(), expected) << pieces << " pieces, order " << shuffle;
        EXPECT_EQ(bits_of(merged.value()), bits_of(whole.value()));
        SquareSum exchanged;
        for (size_t p = 0; p < pieces; ++p) {
          exchanged.merge(SquareSum::from_doubles(std::span(gathered).subspan(
              p * SquareSum::kExchangeDoubles, SquareSum::kExchangeDoubles)));
        }
        EXPECT_EQ(exchanged, merged);
      }
    }
  }
  // The inexact sum this replaces does depend on the split: the check above would catch it.
  EXPECT_GT(double_sums.size(), 1u);
  // And the exact one is the correctly rounded total.
  EXPECT_EQ(bits_of(whole.value()), bits_of(reference_value(reference_limbs(x))));
}

TEST(SquareSum, SixteenBitBuffersEqualTheWidenedFp32Path) {
  // Every pattern of each 16-bit type, one at a time (NaN and Inf included) and all together.
  std::vector<uint16_t> patterns(65536);
  std::iota(patterns.begin(), patterns.end(), 0);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    std::vector<float> widened(patterns.size());
    std::vector<uint16_t> finite;
    for (size_t i = 0; i < patterns.size(); ++i) {
      widened[i] =
          dtype == DType::kBF16 ? to_f32(BFloat16{patterns[i]}) : to_f32(Float16{patterns[i]});
      if (std::isfinite(widened[i])) finite.push_back(patterns[i]);
    }
    for (size_t i = 0; i < patterns.size(); ++i) {
      SquareSum direct;
      direct.add(patterns.data(), dtype, i, 1);
      SquareSum wide;
      wide.add(std::span(widened).subspan(i, 1));
      ASSERT_EQ(direct.to_doubles(), wide.to_doubles())
          << dtype_name(dtype) << " pattern 0x" << std::hex << patterns[i];
    }
    std::vector<float> finite_widened;
    for (float w : widened) {
      if (std::isfinite(w)) finite_widened.push_back(w);
    }
    SquareSum direct;
    direct.add(finite.data(), dtype, 0, finite.size());
    SquareSum wide;
    wide.add(finite_widened);
    EXPECT_EQ(direct, wide) << dtype_name(dtype);
    EXPECT_TRUE(std::isfinite(direct.value()));
  }
}

TEST(SquareSum, DTypeOverloadReadsTheRangeFromFirst) {
  const std::vector<float> x = wide_values(1000, 5);
  SquareSum by_span;
  by_span.add(std::span(x).subspan(123, 456));
  SquareSum by_range;
  by_range.add(x.data(), DType::kF32, 123, 456);
  EXPECT_EQ(by_range, by_span);
  EXPECT_NE(by_range, SquareSum{});

  std::vector<BFloat16> bf(x.size());
  convert(x, bf);
  std::vector<float> bf_widened(bf.size());
  convert(bf, bf_widened);
  SquareSum bf_direct;
  bf_direct.add(bf.data(), DType::kBF16, 100, 800);
  SquareSum bf_wide;
  bf_wide.add(std::span(bf_widened).subspan(100, 800));
  EXPECT_EQ(bf_direct, bf_wide);
}

TEST(SquareSum, InfGivesInfAndNaNDominates) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(square_sum(std::vector<float>{1.0f, inf, 2.0f}), HUGE_VAL);
  EXPECT_EQ(square_sum(std::vector<float>{-inf}), HUGE_VAL);
  EXPECT_TRUE(std::isnan(square_sum(std::vector<float>{nan})));
  EXPECT_TRUE(std::isnan(square_sum(std::vector<float>{inf, -nan, -inf})));

  // Far into a long buffer, in different chunks: Inf first, a NaN later.
  std::vector<float> x = wide_values(1 << 20, 3, -20, 20);
  x[300001] = inf;
  SquareSum with_inf;
  with_inf.add(x);
  EXPECT_EQ(with_inf.value(), HUGE_VAL);
  x[900001] = nan;
  SquareSum with_nan;
  with_nan.add(x);
  EXPECT_TRUE(std::isnan(with_nan.value()));

  // Merging and the exchange keep the state; NaN wins in either order.
  SquareSum finite;
  finite.add(std::vector<float>{1.0f});
  SquareSum a = finite;
  a.merge(with_inf);
  EXPECT_EQ(SquareSum::from_doubles(a.to_doubles()).value(), HUGE_VAL);
  a.merge(with_nan);
  EXPECT_TRUE(std::isnan(SquareSum::from_doubles(a.to_doubles()).value()));
  SquareSum b = with_nan;
  b.merge(with_inf);
  EXPECT_TRUE(std::isnan(b.value()));

  // 16-bit Inf and NaN.
  const std::vector<uint16_t> f16 = {0x3c00, 0x7c00};  // 1, +Inf
  SquareSum h;
  h.add(f16.data(), DType::kF16, 0, f16.size());
  EXPECT_EQ(h.value(), HUGE_VAL);
  const std::vector<uint16_t> bf16 = {0x3f80, 0xffc1};  // 1, NaN
  SquareSum g;
  g.add(bf16.data(), DType::kBF16, 0, bf16.size());
  EXPECT_TRUE(std::isnan(g.value()));
}

TEST(SquareSum, ValueDoesNotDependOnTheRoundingMode) {
  const std::vector<float> x = wide_values(10000, 8);
  SquareSum s;
  s.add(x);
  const double nearest = s.value();
  const int saved = std::fegetround();
  for (int mode : {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO}) {
    std::fesetround(mode);
    const double v = s.value();
    std::fesetround(saved);
    EXPECT_EQ(bits_of(v), bits_of(nearest)) << "mode " << mode;
  }
}

TEST(SquareSum, FromDoublesRejectsWhatToDoublesCannotWrite) {
  std::vector<double> good = SquareSum{}.to_doubles();
  ASSERT_EQ(good.size(), SquareSum::kExchangeDoubles);
  EXPECT_NO_THROW(SquareSum::from_doubles(good));
  EXPECT_THROW(SquareSum::from_doubles(std::span(good).first(good.size() - 1)), InvalidArgument);
  for (double bad : {-1.0, 0.5, 0x1p32, std::numeric_limits<double>::quiet_NaN()}) {
    std::vector<double> d = good;
    d[3] = bad;
    EXPECT_THROW(SquareSum::from_doubles(d), InvalidArgument) << bad;
  }
  std::vector<double> state = good;
  state.back() = 3;
  EXPECT_THROW(SquareSum::from_doubles(state), InvalidArgument);
}

TEST(SquareSum, DTypeOverloadRejectsANullBufferAndUnknownDType) {
  SquareSum s;
  EXPECT_THROW(s.add(nullptr, DType::kF32, 0, 4), InvalidArgument);
  EXPECT_NO_THROW(s.add(nullptr, DType::kF32, 0, 0));
  const float one = 1.0f;
  EXPECT_THROW(s.add(&one, static_cast<DType>(7), 0, 1), InvalidArgument);
  EXPECT_EQ(s, SquareSum{});
}

}  // namespace
}  // namespace zerodp
