// gemm against a naive triple loop in double; its determinism across threads and addresses.
// (Registered in tests/nn/CMakeLists.txt, next to the layers that use it.)
#include "tensor/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tensor/dtype.h"

namespace zerodp {
namespace {

constexpr GemmCompute kFp32 = GemmCompute::kFP32;
constexpr GemmCompute kBf16 = GemmCompute::kBF16;

struct Case {
  Transpose ta;
  Transpose tb;
  size_t M, N, K;
  size_t pad = 0;  // extra elements per row beyond the minimum leading dimension
};

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Operands for one case, stored with their leading dimensions.
struct Operands {
  size_t lda, ldb, ldc;
  std::vector<float> a, b, c;
  Operands(const Case& k, uint32_t seed) {
    const bool ta = k.ta == Transpose::kYes;
    const bool tb = k.tb == Transpose::kYes;
    lda = (ta ? k.M : k.K) + k.pad;
    ldb = (tb ? k.K : k.N) + k.pad;
    ldc = k.N + k.pad;
    a = random_vector((ta ? k.K : k.M) * lda, seed);
    b = random_vector((tb ? k.N : k.K) * ldb, seed + 1);
    c = random_vector(k.M * ldc, seed + 2);
  }
};

// alpha * op(A) op(B) + beta * C in double, beta == 0 not reading C (BLAS).
std::vector<double> reference(const Case& k, const Operands& o, float alpha, float beta) {
  const bool ta = k.ta == Transpose::kYes;
  const bool tb = k.tb == Transpose::kYes;
  std::vector<double> c(o.c.size());
  for (size_t i = 0; i < k.M; ++i) {
    for (size_t j = 0; j < k.N; ++j) {
      double sum = 0.0;
      for (size_t p = 0; p < k.K; ++p) {
        const double x = ta ? o.a[p * o.lda + i] : o.a[i * o.lda + p];
        const double y = tb ? o.b[j * o.ldb + p] : o.b[p * o.ldb + j];
        sum += x * y;
      }
      const double old = beta == 0.0f ? 0.0 : static_cast<double>(beta) * o.c[i * o.ldc + j];
      c[i * o.ldc + j] = static_cast<double>(alpha) * sum + old;
    }
  }
  return c;
}

void run(const Case& k, Operands& o, float alpha, float beta,
         GemmCompute compute = GemmCompute::kFP32) {
  gemm(compute, k.ta, k.tb, k.M, k.N, k.K, alpha, o.a, o.lda, o.b, o.ldb, beta, o.c, o.ldc);
}

// fp32 products of K terms in [-1, 1]: the error of a sum grows at most like K * 2^-24 per
// term magnitude; 4e-7 * (K + 2) covers it with margin (oneDNN's blocked sums do better).
void expect_near(const Case& k, const Operands& o, const std::vector<double>& want,
                 const std::vector<float>& before, float alpha, float beta, const char* what) {
  const double tol = 4e-7 * static_cast<double>(k.K + 2) * (std::abs(alpha) + std::abs(beta));
  for (size_t i = 0; i < k.M; ++i) {
    for (size_t j = 0; j < k.N; ++j) {
      ASSERT_NEAR(o.c[i * o.ldc + j], want[i * o.ldc + j], tol)
          << what << " M=" << k.M << " N=" << k.N << " K=" << k.K << " ta=" << int(k.ta)
          << " tb=" << int(k.tb) << " at (" << i << ", " << j << ")";
    }
    // Padding between rows of C is never written.
    for (size_t j = k.N; j < o.ldc; ++j) ASSERT_EQ(o.c[i * o.ldc + j], before[i * o.ldc + j]);
  }
}

void expect_matches_reference(const Case& k, float alpha, float beta) {
  Operands o(k, static_cast<uint32_t>(k.M * 131 + k.N * 17 + k.K));
  const std::vector<double> want = reference(k, o, alpha, beta);
  const std::vector<float> before = o.c;
  run(k, o, alpha, beta);
  expect_near(k, o, want, before, alpha, beta, "fp32");
}

constexpr Transpose kN = Transpose::kNo;
constexpr Transpose kT = Transpose::kYes;

TEST(Gemm, MatchesReferenceForAllTransposesAndOddSizes) {
  const size_t sizes[] = {1, 2, 3, 17, 64, 129};
  for (Transpose ta : {kN, kT}) {
    for (Transpose tb : {kN, kT}) {
      for (size_t M : sizes) {
        for (size_t N : sizes) {
          for (size_t K : {size_t{1}, size_t{5}, size_t{33}, size_t{130}}) {
            expect_matches_reference({ta, tb, M, N, K}, 1.0f, 0.0f);
          }
        }
      }
    }
  }
}

TEST(Gemm, BetaOneAccumulatesIntoC) {
  for (Transpose ta : {kN, kT}) {
    for (Transpose tb : {kN, kT}) {
      expect_matches_reference({ta, tb, 37, 19, 23}, 1.0f, 1.0f);
      expect_matches_reference({ta, tb, 1, 19, 23}, 1.0f, 1.0f);
      expect_matches_reference({ta, tb, 37, 1, 23}, 1.0f, 1.0f);
    }
  }
}

TEST(Gemm, AlphaAndBetaScale) {
  expect_matches_reference({kN, kT, 21, 13, 11}, -0.5f, 2.0f);
  expect_matches_reference({kT, kN, 21, 13, 11}, 0.125f, -1.0f);
}

TEST(Gemm, LeadingDimensionsLargerThanRows) {
  for (Transpose ta : {kN, kT}) {
    for (Transpose tb : {kN, kT}) {
      expect_matches_reference({ta, tb, 31, 29, 27, /*pad=*/5}, 1.0f, 1.0f);
    }
  }
}

// Shapes that the tiling cuts into several tiles, so the pool's path is checked too.
TEST(Gemm, MultiTileShapesMatchReference) {
  // Odd sizes, so the last row and column blocks are longer than the others.
  ASSERT_EQ(gemm_tile_count(1030, 600, 64), 4u);
  ASSERT_EQ(gemm_tile_count(600, 1030, 64), 4u);
  set_gemm_threads(2);
  expect_matches_reference({kN, kT, 1030, 600, 64}, 1.0f, 1.0f);
  expect_matches_reference({kT, kN, 600, 1030, 64}, 1.0f, 0.0f);
  set_gemm_threads(1);
  expect_matches_reference({kN, kN, 1030, 600, 64}, 1.0f, 0.0f);
  expect_matches_reference({kT, kT, 600, 1030, 64}, 1.0f, 0.0f);
}

TEST(Gemm, BetaZeroIgnoresNaNInC) {
  for (size_t M : {size_t{1}, size_t{9}}) {
    const Case k{kN, kN, M, 7, 5};
    Operands o(k, 3);
    std::fill(o.c.begin(), o.c.end(), std::numeric_limits<float>::quiet_NaN());
    run(k, o, 1.0f, 0.0f);
    for (float x : o.c) EXPECT_FALSE(std::isnan(x));
  }
}

TEST(Gemm, KZeroScalesCByBeta) {
  const Case k{kN, kN, 3, 4, 0};
  Operands o(k, 5);
  std::vector<float> before = o.c;
  run(k, o, 1.0f, 0.5f);
  for (size_t i = 0; i < o.c.size(); ++i) EXPECT_EQ(o.c[i], 0.5f * before[i]);
  std::fill(o.c.begin(), o.c.end(), std::numeric_limits<float>::quiet_NaN());
  run(k, o, 1.0f, 0.0f);
  for (float x : o.c) EXPECT_EQ(x, 0.0f);
}

TEST(Gemm, EmptyProductsAreNoOps) {
  std::vector<float> c{1.0f, 2.0f};
  gemm(kFp32, kN, kN, 0, 2, 3, 1.0f, {}, 3, std::vector<float>(6), 2, 0.0f, c, 2);
  gemm(kFp32, kN, kN, 1, 0, 3, 1.0f, std::vector<float>(3), 3, {}, 1, 0.0f, c, 1);
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_EQ(c[1], 2.0f);
}

std::vector<float> product_bits(const Case& k, const Operands& o, int threads, size_t shift) {
  set_gemm_threads(threads);
  // Copy every operand `shift` floats into a fresh buffer: new addresses, new alignment.
  std::vector<float> a(o.a.size() + shift), b(o.b.size() + shift), c(o.c.size() + shift);
  std::copy(o.a.begin(), o.a.end(), a.begin() + static_cast<std::ptrdiff_t>(shift));
  std::copy(o.b.begin(), o.b.end(), b.begin() + static_cast<std::ptrdiff_t>(shift));
  std::copy(o.c.begin(), o.c.end(), c.begin() + static_cast<std::ptrdiff_t>(shift));
  gemm(kFp32, k.ta, k.tb, k.M, k.N, k.K, 1.0f, std::span<const float>(a).subspan(shift), o.lda,
       std::span<const float>(b).subspan(shift), o.ldb, 1.0f, std::span<float>(c).subspan(shift),
       o.ldc);
  set_gemm_threads(1);
  return {c.begin() + static_cast<std::ptrdiff_t>(shift), c.end()};
}

// The shapes that change bits with oneDNN's own threading (gemm.h): K much larger than M
// and N, gemv, and the GPT weight-gradient shapes.
TEST(Gemm, BitsDoNotDependOnThreadCountOrAddresses) {
  const Case cases[] = {{kN, kT, 512, 256, 1024}, {kT, kN, 128, 512, 1024},
                        {kN, kN, 64, 256, 4096},  {kN, kN, 1, 512, 384},
                        {kT, kN, 64, 1, 4096},    {kN, kT, 1030, 600, 129}};
  for (const Case& k : cases) {
    const Operands o(k, 11);
    const std::vector<float> want = product_bits(k, o, 1, 0);
    for (int threads : {2, 5}) {
      for (size_t shift : {size_t{0}, size_t{3}}) {
        const std::vector<float> got = product_bits(k, o, threads, shift);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "M=" << k.M << " N=" << k.N << " K=" << k.K << " threads=" << threads
            << " shift=" << shift;
      }
    }
  }
}

// Rank threads each own a pool; concurrent calls with different settings agree.
TEST(Gemm, ConcurrentCallersEachUseTheirOwnThreads) {
  const Case k{kN, kT, 512, 384, 128};
  const Operands o(k, 11);
  const std::vector<float> want = product_bits(k, o, 1, 0);
  std::vector<std::vector<float>> got(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) got[t] = product_bits(k, o, t + 1, 0);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(0, std::memcmp(want.data(), g.data(), want.size() * 4));
}

TEST(Gemm, ThreadSettingIsPerThread) {
  set_gemm_threads(3);
  int seen_elsewhere = 0;
  std::thread([&] { seen_elsewhere = gemm_threads(); }).join();
  EXPECT_EQ(gemm_threads(), 3);
  EXPECT_EQ(seen_elsewhere, 1);
  set_gemm_threads(1);
}

TEST(Gemm, RejectsBadThreadCounts) {
  EXPECT_THROW(set_gemm_threads(0), InvalidArgument);
  EXPECT_THROW(set_gemm_threads(-2), InvalidArgument);
  EXPECT_THROW(set_gemm_threads(100000), InvalidArgument);
}

TEST(Gemm, RejectsShortOperandsAndSmallLeadingDimensions) {
  std::vector<float> a(6), b(6), c(4);
  // a is (2, 3): fine; K = 3 needs b (3, 2) = 6 elements and c (2, 2) = 4.
  EXPECT_NO_THROW(gemm(kFp32, kN, kN, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2));
  EXPECT_THROW(
      gemm(kFp32, kN, kN, 2, 2, 3, 1.0f, std::span<const float>(a).first(5), 3, b, 2, 0.0f, c, 2),
      InvalidArgument);
  EXPECT_THROW(gemm(kFp32, kN, kN, 2, 2, 3, 1.0f, a, 2, b, 2, 0.0f, c, 2),
               InvalidArgument);  // lda < K
  EXPECT_THROW(gemm(kFp32, kN, kT, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2),
               InvalidArgument);  // ldb < K
  EXPECT_THROW(
      gemm(kFp32, kN, kN, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, std::span<float>(c).first(3), 2),
      InvalidArgument);
  try {
    gemm(kFp32, kT, kN, 2, 2, 3, 1.0f, std::span<const float>(a).first(4), 2, b, 2, 0.0f, c, 2);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    // The message names the operand, what it holds and what the shape needs.
    EXPECT_NE(std::string(e.what()).find("a holds 4 elements"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("spans 6"), std::string::npos) << e.what();
  }
}

TEST(Gemm, RejectsOutputOverlappingAnInput) {
  std::vector<float> buf(16);
  std::span<float> all(buf);
  EXPECT_THROW(gemm(kFp32, kN, kN, 2, 2, 2, 1.0f, all.first(4), 2, all.subspan(8, 4), 2, 0.0f,
                    all.subspan(2, 4), 2),
               InvalidArgument);
}

TEST(Gemm, TilingNeverCutsSmallProducts) {
  EXPECT_EQ(gemm_tile_count(64, 64, 32), 1u);      // one attention head
  EXPECT_EQ(gemm_tile_count(1, 100000, 64), 1u);   // gemv
  EXPECT_GE(gemm_tile_count(1024, 384, 128), 2u);  // GPT small: qkv
  EXPECT_GE(gemm_tile_count(512, 128, 1024), 2u);  // GPT small: fc weight gradient
  EXPECT_GE(gemm_tile_count(1024, 1024, 1024), 8u);
}

// ---------------------------------------------------------------- bf16 compute

// The bf16 product is the exact product of the rounded operands up to fp32 accumulation:
// the double reference of the rounded operands, with the fp32 tolerance, must hold; against
// the unrounded operands it must not (or the test could not tell bf16 from fp32).
void expect_bf16_matches_rounded_reference(const Case& k, float alpha, float beta) {
  Operands o(k, static_cast<uint32_t>(k.M * 7 + k.N * 3 + k.K));
  Operands rounded = o;
  for (auto& x : rounded.a) x = to_f32(to_bf16(x));
  for (auto& x : rounded.b) x = to_f32(to_bf16(x));
  const std::vector<double> want = reference(k, rounded, alpha, beta);
  const std::vector<float> before = o.c;
  run(k, o, alpha, beta, GemmCompute::kBF16);
  expect_near(k, o, want, before, alpha, beta, "bf16");
}

TEST(GemmBf16, MatchesTheProductOfRoundedOperands) {
  for (Transpose ta : {kN, kT}) {
    for (Transpose tb : {kN, kT}) {
      for (size_t M : {size_t{1}, size_t{17}, size_t{129}}) {
        for (size_t N : {size_t{1}, size_t{3}, size_t{64}}) {
          for (size_t K : {size_t{1}, size_t{33}, size_t{130}}) {
            expect_bf16_matches_rounded_reference({ta, tb, M, N, K}, 1.0f, 0.0f);
          }
        }
      }
    }
  }
  expect_bf16_matches_rounded_reference({kN, kT, 600, 520, 384, 3}, 0.5f, 1.0f);  // tiles, ld
  expect_bf16_matches_rounded_reference({kT, kN, 33, 65, 7, 2}, -2.0f, 0.25f);
}

TEST(GemmBf16, DiffersFromFp32AndIsDeterministic) {
  const Case k{kN, kT, 512, 384, 512};
  const Operands o(k, 5);
  auto product = [&](GemmCompute compute, int threads, size_t shift) {
    std::vector<float> a(o.a.size() + shift), b(o.b.size() + shift), c(o.c.size() + shift);
    std::copy(o.a.begin(), o.a.end(), a.begin() + static_cast<std::ptrdiff_t>(shift));
    std::copy(o.b.begin(), o.b.end(), b.begin() + static_cast<std::ptrdiff_t>(shift));
    set_gemm_threads(threads);
    gemm(compute, k.ta, k.tb, k.M, k.N, k.K, 1.0f, std::span<const float>(a).subspan(shift), o.lda,
         std::span<const float>(b).subspan(shift), o.ldb, 0.0f, std::span<float>(c).subspan(shift),
         o.ldc);
    set_gemm_threads(1);
    return std::vector<float>(c.begin() + static_cast<std::ptrdiff_t>(shift), c.end());
  };
  const std::vector<float> want = product(GemmCompute::kBF16, 1, 0);
  for (int threads : {1, 2, 3}) {
    for (size_t shift : {size_t{0}, size_t{5}}) {
      const std::vector<float> got = product(GemmCompute::kBF16, threads, shift);
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
          << "threads=" << threads << " shift=" << shift;
    }
  }
  const std::vector<float> fp32 = product(GemmCompute::kFP32, 1, 0);
  double max_diff = 0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(fp32[i] - want[i])));
  }
  EXPECT_GT(max_diff, 1e-3) << "bf16 compute gave fp32 results";
  EXPECT_LT(max_diff, 0.5);
}

// A product under Bf16Operands scopes has the bits of one without: the scope changes where
// the rounded operands come from, not what they are. Covers a lazily rounded buffer, a
// given rounded copy (the engine's stored bf16 weights), an operand that is a slice of a
// scoped buffer (a head of qkv), and one that only starts inside it (not taken from it).
TEST(GemmBf16, OperandScopesKeepTheBits) {
  const Case k{kN, kT, 200, 96, 130, 5};
  const Operands o(k, 11);
  std::vector<BFloat16> b16(o.b.size());
  convert(std::span<const float>(o.b), std::span<BFloat16>(b16));
  std::vector<float> b_widened(o.b.size());
  convert(std::span<const BFloat16>(b16), std::span<float>(b_widened));
  auto product = [&](const std::vector<float>& b, int scopes) {
    std::vector<float> c = o.c;
    std::optional<Bf16Operands> sa, sb;
    if (scopes & 1) sa.emplace(kBf16, std::span<const float>(o.a).subspan(3));  // all but a's start
    if (scopes & 2) sb.emplace(kBf16, std::span<const float>(b), std::span<const BFloat16>(b16));
    if (scopes & 4) sb.emplace(kBf16, std::span<const float>(b));
    gemm(kBf16, k.ta, k.tb, k.M, k.N, k.K, 0.5f, o.a, o.lda, b, o.ldb, 1.0f, c, o.ldc);
    return c;
  };
  const std::vector<float> want = product(b_widened, 0);
  for (int scopes : {1, 2, 4, 3, 5}) {
    const std::vector<float> got = product(b_widened, scopes);
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
        << "scopes=" << scopes;
  }
  // A sub-matrix of a scoped buffer: the rounded copy is read at the same offset and stride.
  std::vector<float> c_sub(50 * o.ldc), c_sub_scoped(50 * o.ldc);
  const auto a_rows = std::span<const float>(o.a).subspan(70 * o.lda);
  gemm(kBf16, k.ta, k.tb, 50, k.N, k.K, 1.0f, a_rows, o.lda, b_widened, o.ldb, 0.0f, c_sub, o.ldc);
  {
    const Bf16Operands whole_a(kBf16, o.a);
    gemm(kBf16, k.ta, k.tb, 50, k.N, k.K, 1.0f, a_rows, o.lda, b_widened, o.ldb, 0.0f, c_sub_scoped,
         o.ldc);
  }
  EXPECT_EQ(c_sub, c_sub_scoped);
}

// The given copy is what the product reads: a copy that is not the buffer's rounding shows.
// (Which is why callers may only give one that is.)
TEST(GemmBf16, AGivenRoundedCopyIsReadInsteadOfTheValues) {
  const Case k{kN, kN, 16, 16, 16};
  const Operands o(k, 12);
  std::vector<BFloat16> zeros(o.b.size());  // bf16 +0
  std::vector<float> c(o.c.size(), 7.0f);
  {
    const Bf16Operands b16(kBf16, o.b, zeros);
    gemm(kBf16, k.ta, k.tb, k.M, k.N, k.K, 1.0f, o.a, o.lda, o.b, o.ldb, 0.0f, c, o.ldc);
  }
  if (!gemm_bf16_native()) GTEST_SKIP() << "the fp32 fallback rounds its operands itself";
  for (float x : c) ASSERT_EQ(x, 0.0f);
}

TEST(GemmBf16, OperandScopesRejectMismatchedCopiesAndDeepNesting) {
  const std::vector<float> v(10);
  const std::vector<BFloat16> short_copy(9);
  EXPECT_THROW(Bf16Operands(kBf16, v, short_copy), InvalidArgument);
  {
    std::vector<std::unique_ptr<Bf16Operands>> live;
    for (int i = 0; i < kMaxBf16Operands; ++i) {
      live.push_back(std::make_unique<Bf16Operands>(kBf16, v));
    }
    EXPECT_THROW((Bf16Operands{kBf16, v}), InvalidArgument);
    while (!live.empty()) live.pop_back();  // innermost first, as scopes close
  }
  EXPECT_NO_THROW((Bf16Operands{kBf16, v}));  // all closed again
  // Opened for fp32 products a scope is inert: no limit, nothing recorded.
  std::vector<std::unique_ptr<Bf16Operands>> many;
  for (int i = 0; i < 2 * kMaxBf16Operands; ++i) {
    many.push_back(std::make_unique<Bf16Operands>(GemmCompute::kFP32, v));
  }
}

// ---------------------------------------------------------------- bias

// alpha * op(A) op(B) + bias for each compute, against the double reference of the operands
// the compute multiplies (rounded for bf16), on shapes of one tile and of several, with the
// bits independent of the thread count.
void expect_bias_matches_reference(const Case& k, float alpha, GemmCompute compute) {
  Operands o(k, static_cast<uint32_t>(k.M * 5 + k.N + k.K));
  Operands multiplied = o;
  if (compute == GemmCompute::kBF16) {
    for (auto& x : multiplied.a) x = to_f32(to_bf16(x));
    for (auto& x : multiplied.b) x = to_f32(to_bf16(x));
  }
  const std::vector<float> bias = random_vector(k.N, 77);
  std::vector<double> want = reference(k, multiplied, alpha, 0.0f);
  for (size_t i = 0; i < k.M; ++i) {
    for (size_t j = 0; j < k.N; ++j) want[i * o.ldc + j] += bias[j];
  }
  std::fill(o.c.begin(), o.c.end(), std::nanf(""));  // beta = 0: C is only written
  for (size_t i = 0; i < k.M; ++i) {
    std::fill_n(o.c.begin() + static_cast<std::ptrdiff_t>(i * o.ldc + k.N), k.pad, 7.0f);
  }
  const std::vector<float> before = o.c;
  std::vector<float> one_thread;
  for (int threads : {1, 2}) {
    set_gemm_threads(threads);
    std::vector<float> c = before;
    gemm(compute, k.ta, k.tb, k.M, k.N, k.K, alpha, o.a, o.lda, o.b, o.ldb, 0.0f, c, o.ldc, bias);
    if (threads == 1) {
      one_thread = c;
    } else {
      EXPECT_EQ(0, std::memcmp(one_thread.data(), c.data(), c.size() * sizeof(float)))
          << "M=" << k.M << " N=" << k.N << " K=" << k.K << ": bits changed with 2 threads";
    }
  }
  set_gemm_threads(1);
  o.c = one_thread;
  // The bias adds at most one rounding of a value below 1 + |product|.
  expect_near(k, o, want, before, std::abs(alpha) + 1.0f, 0.0f,
              compute == GemmCompute::kBF16 ? "bf16 + bias" : "fp32 + bias");
}

// Operands stored in bf16 (the bf16 pipeline's activations) give the bits of fp32 operands
// holding the same values, and a bf16 C is the fp32 C rounded as convert() rounds, for every
// transpose, padded strides, several tiles and thread counts, with and without a bias (alpha
// 1, where the primitive adds it, and 0.5, where it goes through an fp32 copy).
TEST(GemmBf16Storage, OperandsAndResultsInBf16KeepTheBits) {
  for (const Case& k : {Case{kN, kT, 17, 64, 33}, Case{kT, kN, 33, 65, 7, 2},
                        Case{kT, kT, 5, 9, 70, 1}, Case{kN, kN, 600, 520, 384, 3}}) {
    Operands o(k, 41);
    // Values a bf16 buffer can hold, kept in both forms.
    std::vector<BFloat16> a16(o.a.size()), b16(o.b.size());
    convert(std::span<const float>(o.a), std::span<BFloat16>(a16));
    convert(std::span<const float>(o.b), std::span<BFloat16>(b16));
    convert(std::span<const BFloat16>(a16), std::span<float>(o.a));
    convert(std::span<const BFloat16>(b16), std::span<float>(o.b));
    const std::vector<float> bias_values = random_vector(k.N, 43);
    for (bool with_bias : {false, true}) {
      for (float alpha : {1.0f, 0.5f}) {
        const std::span<const float> bias =
            with_bias ? std::span<const float>(bias_values) : std::span<const float>();
        std::vector<float> want(o.c.size(), 7.0f);
        gemm(kBf16, k.ta, k.tb, k.M, k.N, k.K, alpha, o.a, o.lda, o.b, o.ldb, 0.0f, want, o.ldc,
             bias);
        for (int threads : {1, 3}) {
          set_gemm_threads(threads);
          const std::string what =
              "M=" + std::to_string(k.M) + " bias=" + std::to_string(with_bias) +
              " alpha=" + std::to_string(alpha) + " threads=" + std::to_string(threads);
          std::vector<float> got(o.c.size(), 7.0f);
          gemm(kBf16, k.ta, k.tb, k.M, k.N, k.K, alpha, a16, o.lda, b16, o.ldb, 0.0f, got, o.ldc,
               bias);
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << what;
          std::fill(got.begin(), got.end(), 7.0f);
          gemm(kBf16, k.ta, k.tb, k.M, k.N, k.K, alpha, o.a, o.lda, b16, o.ldb, 0.0f, got, o.ldc,
               bias);
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << what;
          const BFloat16 untouched = to_bf16(7.0f);
          std::vector<BFloat16> c16(o.c.size(), untouched);
          gemm(kBf16, k.ta, k.tb, k.M, k.N, k.K, alpha, a16, o.lda, o.b, o.ldb, 0.0f, c16, o.ldc,
               bias);
          for (size_t i = 0; i < k.M; ++i) {
            for (size_t j = 0; j < o.ldc; ++j) {
              const BFloat16 expected = j < k.N ? to_bf16(want[i * o.ldc + j]) : untouched;
              ASSERT_EQ(c16[i * o.ldc + j].bits, expected.bits) << what << " at " << i << ", " << j;
            }
          }
        }
        set_gemm_threads(1);
      }
    }
  }
}

// Results below fp32's smallest normal survive into a bf16 C as convert() rounds them (the
// CPU's own bf16 conversion would flush them to zero). The products' own sums may flush
// (AVX-512 BF16's dot products do), so the subnormals come from the bias.
TEST(GemmBf16Storage, ABf16CKeepsSubnormalResults) {
  std::vector<float> a(2 * 2, 0.0f), b(2 * 3, 1.0f), c(2 * 3);
  const std::vector<float> bias = {1e-39f, -3e-39f, 5e-40f};
  std::vector<BFloat16> c16(2 * 3);
  gemm(kBf16, kN, kN, 2, 3, 2, 1.0f, a, 2, b, 3, 0.0f, c, 3, bias);
  gemm(kBf16, kN, kN, 2, 3, 2, 1.0f, a, 2, b, 3, 0.0f, c16, 3, bias);
  for (size_t i = 0; i < c.size(); ++i) {
    // A kernel that flushes its own fp32 sums leaves nothing subnormal to round.
    if (std::fpclassify(c[i]) != FP_SUBNORMAL) GTEST_SKIP() << "this CPU's kernel flushed " << c[i];
    EXPECT_EQ(c16[i].bits, to_bf16(c[i]).bits) << i;
    EXPECT_NE(to_f32(c16[i]), 0.0f) << i;
  }
}

TEST(GemmBf16Storage, WithKZeroABf16CIsTheBiasRounded) {
  std::vector<float> a(3), b(4);
  std::vector<BFloat16> c(3 * 4, to_bf16(9.0f));
  const std::vector<float> bias = {1.0f, -2.0f, 3.14159f, 0.25f};
  gemm(kBf16, kN, kN, 3, 4, 0, 1.0f, a, 1, b, 4, 0.0f, c, 4, bias);
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = 0; j < 4; ++j) EXPECT_EQ(c[i * 4 + j].bits, to_bf16(bias[j]).bits);
  }
  gemm(kBf16, kN, kN, 3, 4, 0, 1.0f, a, 1, b, 4, 0.0f, c, 4);
  for (const BFloat16 x : c) EXPECT_EQ(to_f32(x), 0.0f);
}

TEST(GemmBf16Storage, NeedsBf16ComputeAndAWrittenOnlyC) {
  std::vector<float> a(2 * 3, 1.0f), b(3 * 4, 1.0f), c(2 * 4);
  std::vector<BFloat16> a16(2 * 3), c16(2 * 4);
  try {
    gemm(kFp32, kN, kN, 2, 4, 3, 1.0f, a16, 3, b, 4, 0.0f, c, 4);
    FAIL() << "a bf16 operand was multiplied in fp32";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a is bf16 but compute is fp32"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(gemm(kFp32, kN, kN, 2, 4, 3, 1.0f, a, 3, b, 4, 0.0f, c16, 4), InvalidArgument);
  try {
    gemm(kBf16, kN, kN, 2, 4, 3, 1.0f, a, 3, b, 4, 1.0f, c16, 4);
    FAIL() << "a bf16 c was accumulated into";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("beta must be 0"), std::string::npos) << e.what();
  }
  // A bf16 c overlapping an operand is caught by bytes, not elements.
  std::vector<BFloat16> shared(2 * 3 + 2 * 4);
  EXPECT_THROW(gemm(kBf16, kN, kN, 2, 4, 3, 1.0f, std::span<const BFloat16>(shared).first(6), 3, b,
                    4, 0.0f, std::span<BFloat16>(shared).subspan(5, 8), 4),
               InvalidArgument);
}

// ZERODP_GEMM_BF16=fallback (set by the ctest entry that reruns the bf16 tests) really takes
// the fp32 path.
TEST(GemmFallback, IsTakenWhenAsked) {
  const char* force = std::getenv("ZERODP_GEMM_BF16");
  if (force == nullptr || std::string(force) != "fallback") GTEST_SKIP() << "not asked";
  EXPECT_FALSE(gemm_bf16_native());
}

TEST(GemmBias, IsAddedToEveryRowInBothComputes) {
  for (GemmCompute compute : {GemmCompute::kFP32, GemmCompute::kBF16}) {
    expect_bias_matches_reference({kN, kT, 17, 33, 65}, 1.0f, compute);
    expect_bias_matches_reference({kT, kN, 9, 5, 3, 2}, 0.5f, compute);  // alpha scales only AB
    expect_bias_matches_reference({kN, kT, 600, 520, 384, 3}, 1.0f, compute);  // several tiles
  }
}

TEST(GemmBias, WithKZeroCIsTheBias) {
  std::vector<float> a(3), b(4), c(3 * 4, std::nanf(""));
  const std::vector<float> bias = {1.0f, -2.0f, 3.5f, 0.25f};
  gemm(kFp32, kN, kN, 3, 4, 0, 1.0f, a, 1, b, 4, 0.0f, c, 4, bias);
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = 0; j < 4; ++j) EXPECT_EQ(c[i * 4 + j], bias[j]);
  }
}

TEST(GemmBias, NeedsNValuesAndBetaZero) {
  std::vector<float> a(2 * 3, 1.0f), b(3 * 4, 1.0f), c(2 * 4);
  const std::vector<float> short_bias(3), bias(4);
  EXPECT_THROW(gemm(kFp32, kN, kN, 2, 4, 3, 1.0f, a, 3, b, 4, 0.0f, c, 4, short_bias),
               InvalidArgument);
  EXPECT_THROW(gemm(kFp32, kN, kN, 2, 4, 3, 1.0f, a, 3, b, 4, 1.0f, c, 4, bias), InvalidArgument);
}

TEST(GemmRecording, RecordsEachCallsShapeOnItsThreadWhileItLives) {
  std::vector<float> a(6 * 4, 1.0f), b(4 * 5, 1.0f), c(6 * 5);
  const auto call = [&](Transpose ta, size_t M, size_t N, size_t K) {
    gemm(GemmCompute::kFP32, ta, Transpose::kNo, M, N, K, 1.0f, a, ta == Transpose::kYes ? M : K, b,
         N, 0.0f, c, N);
  };
  call(Transpose::kNo, 6, 5, 4);  // before: not recorded
  std::vector<GemmShape> outer_shapes;
  {
    const GemmRecording outer;
    call(Transpose::kNo, 6, 5, 4);
    {
      const GemmRecording inner;
      call(Transpose::kYes, 3, 5, 4);
      std::thread([&] { call(Transpose::kNo, 2, 2, 2); }).join();  // another thread's
      EXPECT_EQ(inner.shapes(),
                (std::vector<GemmShape>{{Transpose::kYes, Transpose::kNo, 3, 5, 4}}));
    }
    call(Transpose::kNo, 6, 5, 0);  // K == 0 is still a call of that shape
    call(Transpose::kNo, 6, 5, 4);
    outer_shapes = outer.shapes();
  }
  call(Transpose::kNo, 1, 1, 1);  // after: not recorded
  const std::vector<GemmShape> want{{Transpose::kNo, Transpose::kNo, 6, 5, 4},
                                    {Transpose::kNo, Transpose::kNo, 6, 5, 0},
                                    {Transpose::kNo, Transpose::kNo, 6, 5, 4}};
  EXPECT_EQ(outer_shapes, want);
  EXPECT_EQ(distinct_shapes(outer_shapes),
            (std::vector<GemmShape>{{Transpose::kNo, Transpose::kNo, 6, 5, 0},
                                    {Transpose::kNo, Transpose::kNo, 6, 5, 4}}));
  EXPECT_DOUBLE_EQ(want[0].flops(), 2.0 * 6 * 5 * 4);
}

// ---- gemm_batched ----

// A batch laid out as attention's heads are: each of `outer` blocks holds `inner` entries side
// by side (entry j at column j * cols), rows at stride inner * cols + pad, blocks `gap`
// elements apart beyond their rows.
struct Interleaved {
  size_t rows, cols, ld, inner_stride, outer_stride, count;
  Interleaved(size_t r, size_t c, size_t outer, size_t inner, size_t pad, size_t gap)
      : rows(r), cols(c), ld(inner * c + pad), inner_stride(c), outer_stride(r * ld + gap) {
    count = outer * outer_stride;
  }
  size_t at(size_t o, size_t i, size_t r, size_t col) const {
    return o * outer_stride + i * inner_stride + r * ld + col;
  }
};

struct BatchCase {
  Transpose ta, tb;
  size_t M, N, K, outer, inner;
  size_t pad = 0, gap = 0;
};

struct BatchOperands {
  Interleaved la, lb, lc;
  std::vector<float> a, b, c;
  GemmBatch batch;
  BatchOperands(const BatchCase& k, uint32_t seed)
      : la(k.ta == kT ? k.K : k.M, k.ta == kT ? k.M : k.K, k.outer, k.inner, k.pad, k.gap),
        lb(k.tb == kT ? k.N : k.K, k.tb == kT ? k.K : k.N, k.outer, k.inner, k.pad, k.gap),
        lc(k.M, k.N, k.outer, k.inner, k.pad, k.gap) {
    a = random_vector(la.count, seed);
    b = random_vector(lb.count, seed + 1);
    c = random_vector(lc.count, seed + 2);
    batch = {.outer = k.outer,
             .inner = k.inner,
             .outer_a = la.outer_stride,
             .outer_b = lb.outer_stride,
             .outer_c = lc.outer_stride,
             .inner_a = la.inner_stride,
             .inner_b = lb.inner_stride,
             .inner_c = lc.inner_stride};
  }
  void run(const BatchCase& k, GemmCompute compute, float alpha, float beta) {
    gemm_batched(compute, k.ta, k.tb, k.M, k.N, k.K, alpha, std::span<const float>(a), la.ld,
                 std::span<const float>(b), lb.ld, beta, std::span<float>(c), lc.ld, batch);
  }
};

// Every entry against the double product of its (optionally rounded) operands; elements
// outside C's entries keep their values.
void expect_batch_near_reference(const BatchCase& k, GemmCompute compute, float alpha, float beta) {
  BatchOperands o(k, static_cast<uint32_t>(k.M * 5 + k.N * 3 + k.K + k.outer));
  const std::vector<float> before = o.c;
  auto value = [&](float x) {
    return static_cast<double>(compute == kBf16 ? to_f32(to_bf16(x)) : x);
  };
  std::vector<double> want(o.c.size());
  std::vector<bool> written(o.c.size());
  for (size_t e = 0; e < k.outer; ++e) {
    for (size_t h = 0; h < k.inner; ++h) {
      for (size_t i = 0; i < k.M; ++i) {
        for (size_t j = 0; j < k.N; ++j) {
          double sum = 0.0;
          for (size_t p = 0; p < k.K; ++p) {
            sum += value(o.a[k.ta == kT ? o.la.at(e, h, p, i) : o.la.at(e, h, i, p)]) *
                   value(o.b[k.tb == kT ? o.lb.at(e, h, j, p) : o.lb.at(e, h, p, j)]);
          }
          const size_t at = o.lc.at(e, h, i, j);
          want[at] = alpha * sum + (beta == 0.0f ? 0.0 : beta * static_cast<double>(o.c[at]));
          written[at] = true;
        }
      }
    }
  }
  o.run(k, compute, alpha, beta);
  const double tol = 4e-7 * static_cast<double>(k.K + 2) * (std::abs(alpha) + std::abs(beta));
  for (size_t x = 0; x < o.c.size(); ++x) {
    if (written[x]) {
      ASSERT_NEAR(o.c[x], want[x], tol)
          << "M=" << k.M << " N=" << k.N << " K=" << k.K << " ta=" << int(k.ta)
          << " tb=" << int(k.tb) << " entries " << k.outer << "x" << k.inner << " at " << x;
    } else {
      ASSERT_EQ(o.c[x], before[x]) << "written outside the entries at " << x;
    }
  }
}

TEST(GemmBatched, MatchesReferenceForAllTransposesAndBothComputes) {
  for (GemmCompute compute : {kFp32, kBf16}) {
    for (Transpose ta : {kN, kT}) {
      for (Transpose tb : {kN, kT}) {
        expect_batch_near_reference({ta, tb, 7, 5, 3, 2, 3, 1, 4}, compute, 1.0f, 0.0f);
        expect_batch_near_reference({ta, tb, 64, 64, 32, 3, 4}, compute, 0.125f, 0.0f);
        expect_batch_near_reference({ta, tb, 17, 33, 65, 1, 5, 2, 0}, compute, -2.0f, 1.0f);
        expect_batch_near_reference({ta, tb, 1, 1, 1, 4, 1}, compute, 1.0f, 0.5f);
      }
    }
  }
}

// Run under `compute` with `threads`, every buffer shifted by `shift` elements; C's bits.
std::vector<float> batch_bits(const BatchCase& k, GemmCompute compute, int threads, size_t shift) {
  BatchOperands o(k, 21);
  std::vector<float> a(o.a.size() + shift), b(o.b.size() + shift), c(o.c.size() + shift);
  std::copy(o.a.begin(), o.a.end(), a.begin() + static_cast<std::ptrdiff_t>(shift));
  std::copy(o.b.begin(), o.b.end(), b.begin() + static_cast<std::ptrdiff_t>(shift));
  std::copy(o.c.begin(), o.c.end(), c.begin() + static_cast<std::ptrdiff_t>(shift));
  std::vector<float> out;
  std::thread([&] {
    set_gemm_threads(threads);
    gemm_batched(compute, k.ta, k.tb, k.M, k.N, k.K, 0.5f, std::span<const float>(a).subspan(shift),
                 o.la.ld, std::span<const float>(b).subspan(shift), o.lb.ld, 1.0f,
                 std::span<float>(c).subspan(shift), o.lc.ld, o.batch);
    out.assign(c.begin() + static_cast<std::ptrdiff_t>(shift), c.end());
  }).join();
  return out;
}

TEST(GemmBatched, BitsDoNotDependOnThreadCountOrAddresses) {
  const BatchCase cases[] = {{kN, kT, 64, 128, 64, 8, 12}, {kT, kN, 128, 64, 64, 5, 13, 3, 1}};
  for (const BatchCase& k : cases) {
    const GemmBatch b{.outer = k.outer, .inner = k.inner};
    ASSERT_GE(gemm_batched_part_count(k.M, k.N, k.K, b), 3u);  // the threads have parts to share
    for (GemmCompute compute : {kFp32, kBf16}) {
      const std::vector<float> want = batch_bits(k, compute, 1, 0);
      for (int threads : {2, 3}) {
        for (size_t shift : {size_t{0}, size_t{3}}) {
          const std::vector<float> got = batch_bits(k, compute, threads, shift);
          ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
              << "threads=" << threads << " shift=" << shift << " bf16=" << (compute == kBf16);
        }
      }
    }
  }
}

TEST(GemmBatched, PartsAreWholeEntriesAndNeverCutSmallBatches) {
  EXPECT_EQ(gemm_batched_part_count(64, 64, 32, {.outer = 16, .inner = 4}), 1u);  // GPT small
  EXPECT_EQ(gemm_batched_part_count(4096, 4096, 64, {.outer = 1, .inner = 1}), 1u);
  EXPECT_EQ(gemm_batched_part_count(64, 128, 64, {.outer = 8, .inner = 6}), 2u);
  EXPECT_EQ(gemm_batched_part_count(64, 64, 64, {.outer = 1, .inner = 3}), 1u);
  EXPECT_EQ(gemm_batched_part_count(512, 512, 512, {.outer = 2, .inner = 3}), 6u);
}

// Under kBF16 an fp32 operand gives the bits of its rounded values passed as bf16, and a bf16
// C is the fp32 C rounded with convert(), bit for bit.
TEST(GemmBatched, Bf16OperandsAndOutputAgreeWithRoundedFp32) {
  const BatchCase k{kN, kT, 37, 64, 32, 3, 4, 2, 1};
  BatchOperands o(k, 3);
  for (auto& x : o.a) x *= 1e-20f;  // some products are subnormal, which convert() keeps
  std::vector<BFloat16> a16(o.a.size()), b16(o.b.size()), c16(o.c.size());
  convert(std::span<const float>(o.a), std::span<BFloat16>(a16));
  convert(std::span<const float>(o.b), std::span<BFloat16>(b16));
  std::vector<float> c32(o.c.size(), 0.0f);
  gemm_batched(kBf16, k.ta, k.tb, k.M, k.N, k.K, 1e-20f, std::span<const float>(o.a), o.la.ld,
               std::span<const float>(o.b), o.lb.ld, 0.0f, std::span<float>(c32), o.lc.ld, o.batch);
  const std::vector<float> fp32_c = c32;
  std::fill(c32.begin(), c32.end(), 0.0f);
  gemm_batched(kBf16, k.ta, k.tb, k.M, k.N, k.K, 1e-20f, std::span<const BFloat16>(a16), o.la.ld,
               std::span<const BFloat16>(b16), o.lb.ld, 0.0f, std::span<float>(c32), o.lc.ld,
               o.batch);
  ASSERT_EQ(0, std::memcmp(fp32_c.data(), c32.data(), c32.size() * sizeof(float)));
  std::vector<BFloat16> want(c16.size());
  convert(std::span<const float>(fp32_c), std::span<BFloat16>(want));
  size_t subnormal = 0;
  for (size_t x = 0; x < fp32_c.size(); ++x) {
    subnormal += fp32_c[x] != 0.0f && std::abs(fp32_c[x]) < std::numeric_limits<float>::min();
  }
  // Here (AVX512-BF16) some are; a CPU whose kernel flushes its own fp32 sums leaves none,
  // and then only the rounding of normal values is checked.
  RecordProperty("subnormal_results", static_cast<int>(subnormal));
  gemm_batched(kBf16, k.ta, k.tb, k.M, k.N, k.K, 1e-20f, std::span<const BFloat16>(a16), o.la.ld,
               std::span<const float>(o.b), o.lb.ld, 0.0f, std::span<BFloat16>(c16), o.lc.ld,
               o.batch);
  for (size_t e = 0; e < k.outer; ++e) {
    for (size_t h = 0; h < k.inner; ++h) {
      for (size_t i = 0; i < k.M; ++i) {
        for (size_t j = 0; j < k.N; ++j) {
          const size_t at = o.lc.at(e, h, i, j);
          ASSERT_EQ(c16[at].bits, want[at].bits) << "at " << at;
        }
      }
    }
  }
}

TEST(GemmBatched, AStrideOfZeroReadsOneMatrixForEveryEntry) {
  const size_t M = 5, N = 6, K = 7, entries = 3;
  const auto a = random_vector(entries * M * K, 1), b = random_vector(K * N, 2);
  std::vector<float> c(entries * M * N), one(M * N);
  for (GemmCompute compute : {kFp32, kBf16}) {
    gemm_batched(compute, kN, kN, M, N, K, 1.0f, std::span<const float>(a), K,
                 std::span<const float>(b), N, 0.0f, std::span<float>(c), N,
                 {.outer = entries, .outer_a = M * K, .outer_b = 0, .outer_c = M * N});
    for (size_t e = 0; e < entries; ++e) {
      gemm_batched(compute, kN, kN, M, N, K, 1.0f, std::span<const float>(a).subspan(e * M * K), K,
                   std::span<const float>(b), N, 0.0f, std::span<float>(one), N, {});
      ASSERT_EQ(0, std::memcmp(one.data(), c.data() + e * M * N, one.size() * sizeof(float)));
    }
  }
}

TEST(GemmBatched, KZeroScalesEveryEntryByBeta) {
  std::vector<float> a(1), b(1), c(2 * 3 * 4, 2.0f);
  gemm_batched(kFp32, kN, kN, 3, 4, 0, 1.0f, std::span<const float>(a), 1,
               std::span<const float>(b), 4, 0.5f, std::span<float>(c), 4,
               {.inner = 2, .inner_c = 12});
  for (float x : c) ASSERT_EQ(x, 1.0f);
}

TEST(GemmBatched, RejectsWhatItCannotDo) {
  const GemmBatch two{.inner = 2, .inner_a = 6, .inner_b = 12, .inner_c = 8};
  std::vector<float> a(12), b(24), c(16);
  std::vector<BFloat16> a16(12), c16(16);
  const auto ca = std::span<const float>(a), cb = std::span<const float>(b);
  const auto oc = std::span<float>(c);
  EXPECT_NO_THROW(gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca, 3, cb, 4, 0.0f, oc, 4, two));
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgument");
  };
  // Each span must cover its last entry.
  EXPECT_NE(message([&] {
              gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca.first(11), 3, cb, 4, 0.0f, oc, 4, two);
            }).find("a holds 11 elements"),
            std::string::npos);
  EXPECT_THROW(gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca, 3, cb.first(23), 4, 0.0f, oc, 4, two),
               InvalidArgument);
  EXPECT_THROW(gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca, 3, cb, 4, 0.0f, oc.first(15), 4, two),
               InvalidArgument);
  EXPECT_THROW(gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca, 2, cb, 4, 0.0f, oc, 4, two),
               InvalidArgument);  // lda < K
  // bf16 values with fp32 compute; a bf16 C accumulated into.
  EXPECT_NE(message([&] {
              gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, std::span<const BFloat16>(a16), 3, cb, 4,
                           0.0f, oc, 4, two);
            }).find("a is bf16 but compute is fp32"),
            std::string::npos);
  EXPECT_THROW(gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca, 3, cb, 4, 0.0f,
                            std::span<BFloat16>(c16), 4, two),
               InvalidArgument);
  EXPECT_THROW(gemm_batched(kBf16, kN, kN, 2, 4, 3, 1.0f, ca, 3, cb, 4, 1.0f,
                            std::span<BFloat16>(c16), 4, two),
               InvalidArgument);
  // C's entries overlapping each other (stride 4 < the 2 x 4 an entry spans), or written once
  // for two entries, or C overlapping an input.
  GemmBatch overlapping = two;
  overlapping.inner_c = 4;
  EXPECT_NE(message([&] {
              gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca, 3, cb, 4, 0.0f, oc, 4, overlapping);
            }).find("c's entries overlap"),
            std::string::npos);
  overlapping.inner_c = 0;
  EXPECT_THROW(gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca, 3, cb, 4, 0.0f, oc, 4, overlapping),
               InvalidArgument);
  std::vector<float> shared(64);
  EXPECT_THROW(gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, std::span<const float>(shared), 3, cb, 4,
                            0.0f, std::span<float>(shared).subspan(8), 4, two),
               InvalidArgument);
  // Heads side by side in columns do not overlap: entry j at column 4 j, rows at stride 8.
  GemmBatch heads = two;
  heads.inner_c = 4;
  EXPECT_NO_THROW(gemm_batched(kFp32, kN, kN, 2, 4, 3, 1.0f, ca, 3, cb, 4, 0.0f, oc, 8, heads));
}

TEST(GemmBatched, RecordsOneShapePerCallWithEntries) {
  std::vector<float> a(2 * 6), b(2 * 12), c(2 * 8);
  const GemmRecording rec;
  gemm_batched(kFp32, kN, kT, 2, 4, 3, 1.0f, std::span<const float>(a), 3,
               std::span<const float>(b), 3, 0.0f, std::span<float>(c), 4,
               {.inner = 2, .inner_a = 6, .inner_b = 12, .inner_c = 8});
  gemm_batched(kFp32, kN, kT, 2, 4, 3, 1.0f, std::span<const float>(a), 3,
               std::span<const float>(b), 3, 0.0f, std::span<float>(c), 4, {.outer = 0});
  EXPECT_EQ(rec.shapes(), (std::vector<GemmShape>{{kN, kT, 2, 4, 3}}));
}

}  // namespace
}  // namespace zerodp
