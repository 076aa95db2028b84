#include "optim/adamw.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace zerodp {
namespace {

struct State {
  std::vector<float> p, m, v;
  explicit State(std::vector<float> p0) : p(std::move(p0)), m(p.size(), 0.0f), v(p.size(), 0.0f) {}
  AdamWShard shard(std::span<const float> grad, size_t offset = 0) {
    return {.master = p, .m = m, .v = v, .grad = grad, .offset = offset};
  }
};

::testing::AssertionResult same_bits(std::span<const float> got, std::span<const float> want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << std::hexfloat << got[i] << " want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-6.0f, 1.0f);
  std::vector<float> x(n);
  for (float& xi : x) xi = normal(rng) * scale * std::pow(10.0f, exponent(rng));
  return x;
}

// torch 1.13.1 (Debian bookworm python3-torch, CPU capability AVX2, one thread) printed these:
//   a = Parameter(tensor(p0[:8])); b = Parameter(tensor(p0[8:]))
//   opt = AdamW([{params: [a], weight_decay: 0.1}, {params: [b], weight_decay: 0.0}],
//               lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=False)
//   three steps with the gradients below; p, exp_avg, exp_avg_sq after each, as float.hex().
// The values were chosen so that rounding m's and v's products apart (no FMA) changes p.
constexpr size_t kLiteralCount = 12;
const float kP0[kLiteralCount] = {0.08f,  -0.02f, 0.01f, 0.04f,  0.02f, 0.12f,
                                  -0.81f, 0.05f,  0.0f,  -0.21f, 0.62f, 1.5f};
const float kGrad[3][kLiteralCount] = {
    {-0.63f, -0.39f, 0.7f, 0.3f, 0.68f, -0.15f, -0.11f, 0.72f, -0.27f, 0.51f, 0.38f, 3.0f},
    {-0.52f, 0.61f, -0.32f, -0.69f, 0.89f, -0.99f, -0.08f, -0.66f, 0.35f, 0.76f, 0.07f, -1e-4f},
    {0.41f, 0.01f, -0.83f, -0.59f, -0.24f, 0.66f, -0.1f, -0.2f, -0.58f, -0.32f, -0.45f, 0.0f}};
// [step][p, m, v][element]
const float kTorch[3][3][kLiteralCount] = {
    {{0x1.4bbe44p-4f, -0x1.374362p-6f, 0x1.26e114p-7f, 0x1.3f748ap-5f, 0x1.374362p-6f,
      0x1.ef911cp-4f, -0x1.9e2aa2p-1f, 0x1.915df8p-5f, 0x1.0624dcp-10f, -0x1.b020c4p-3f,
      0x1.3ced92p-1f, 0x1.7fbe76p+0f},
     {-0x1.020c4ap-4f, -0x1.3f7ceep-5f, 0x1.1eb852p-4f, 0x1.eb852p-6f, 0x1.16872cp-4f,
      -0x1.eb852p-7f, -0x1.6872bp-7f, 0x1.26e97ap-4f, -0x1.ba5e36p-6f, 0x1.a1cacp-5f,
      0x1.374bc6p-5f, 0x1.333334p-2f},
     {0x1.4523f6p-6f, 0x1.f266bap-8f, 0x1.916872p-6f, 0x1.26e97ap-8f, 0x1.7acc5p-6f,
      0x1.26e97ap-10f, 0x1.3d31bap-11f, 0x1.a8ac5ep-6f, 0x1.ddc1eap-9f, 0x1.aa25d8p-7f,
      0x1.d92b7ep-8f, 0x1.cccccep-2f}},
    {{0x1.4fc6dep-4f, -0x1.3b924p-6f, 0x1.1cf15ap-7f, 0x1.42cc32p-5f, 0x1.26eee8p-6f,
      0x1.f2e6c8p-4f, -0x1.9d9f22p-1f, 0x1.9166e4p-5f, 0x1.ae22p-11f, -0x1.b22602p-3f,
      0x1.3c8446p-1f, 0x1.7f91fcp+0f},
     {-0x1.bd3c36p-4f, 0x1.a8587ep-6f, 0x1.fbe76ep-6f, -0x1.581062p-5f, 0x1.339c0ep-3f,
      -0x1.cccccep-4f, -0x1.25460ap-6f, -0x1.3a92c4p-10f, 0x1.5e9e1cp-7f, 0x1.f34d6ap-4f,
      0x1.5182a8p-5f, 0x1.147842p-2f},
     {0x1.093294p-5f, 0x1.a731d4p-6f, 0x1.d13942p-6f, 0x1.cc100ep-6f, 0x1.f85f8ep-5f,
      0x1.9a3444p-5f, 0x1.d51b5p-11f, 0x1.7c244p-5f, 0x1.3a2bep-7f, 0x1.51cb88p-5f, 0x1.d19156p-8f,
      0x1.b5c29p-2f}},
    {{0x1.5161eep-4f, -0x1.3f152cp-6f, 0x1.27111ap-7f, 0x1.48075ep-5f, 0x1.1ca822p-6f,
      0x1.f39d9cp-4f, -0x1.9d12bep-1f, 0x1.927b98p-5f, 0x1.44cdeep-10f, -0x1.b333cap-3f,
      0x1.3c8f6ap-1f, 0x1.7f6f2ap+0f},
     {-0x1.d18d24p-5f, 0x1.8e4b8cp-6f, -0x1.c36112p-5f, -0x1.8c7e28p-4f, 0x1.c764aep-4f,
      -0x1.20c49ap-5f, -0x1.abc946p-6f, -0x1.595ffp-6f, -0x1.8c3f3ep-5f, 0x1.3e4cd8p-4f,
      -0x1.0385ccp-7f, 0x1.f1a542p-3f},
     {0x1.40ca9cp-5f, 0x1.921de8p-6f, 0x1.f72798p-5f, 0x1.691c8ep-5f, 0x1.f6bf6p-5f, 0x1.1c0edp-4f,
      0x1.61e5cep-10f, 0x1.7984bep-5f, 0x1.a8cf6ep-6f, 0x1.6ad92cp-5f, 0x1.1475d8p-6f,
      0x1.9fdf3cp-2f}}};

TEST(AdamW, MatchesTorch113BitForBitOverThreeSteps) {
  State s({kP0, kP0 + kLiteralCount});
  const Range decay[] = {{0, 8}};  // elements 8..11 are the weight_decay=0 group
  const AdamWConfig config{
      .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (int step = 1; step <= 3; ++step) {
    adamw_step(s.shard(kGrad[step - 1]), decay, config, step, 1.0f);
    EXPECT_TRUE(same_bits(s.p, kTorch[step - 1][0])) << "master, step " << step;
    EXPECT_TRUE(same_bits(s.m, kTorch[step - 1][1])) << "m, step " << step;
    EXPECT_TRUE(same_bits(s.v, kTorch[step - 1][2])) << "v, step " << step;
  }
}

TEST(AdamW, PortablePathMatchesTorch113Too) {
  State s({kP0, kP0 + kLiteralCount});
  for (int step = 1; step <= 3; ++step) {
    const std::span<const float> g = kGrad[step - 1];
    const AdamWConfig config{};
    portable::adamw_update({.master = std::span(s.p).first(8),
                            .m = std::span(s.m).first(8),
                            .v = std::span(s.v).first(8),
                            .grad = g.first(8)},
                           true, config, step, 1.0f);
    portable::adamw_update({.master = std::span(s.p).subspan(8),
                            .m = std::span(s.m).subspan(8),
                            .v = std::span(s.v).subspan(8),
                            .grad = g.subspan(8)},
                           false, config, step, 1.0f);
  }
  EXPECT_TRUE(same_bits(s.p, kTorch[2][0]));
  EXPECT_TRUE(same_bits(s.m, kTorch[2][1]));
  EXPECT_TRUE(same_bits(s.v, kTorch[2][2]));
}

// The textbook formula in double (decoupled decay first, then bias-corrected moments).
struct DoubleReference {
  std::vector<double> p, m, v;
  void step(std::span<const float> grad, const AdamWConfig& c, int64_t t, bool decay,
            double grad_scale) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = static_cast<double>(grad[i]) * grad_scale;
      if (decay) p[i] -= c.lr * c.weight_decay * p[i];
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
      const double mhat = m[i] / (1 - std::pow(c.beta1, static_cast<double>(t)));
      const double vhat = v[i] / (1 - std::pow(c.beta2, static_cast<double>(t)));
      p[i] -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
    }
  }
};

TEST(AdamW, AgreesWithTheFormulaInDoubleWithinStatedTolerances) {
  // fp32 rounding of ~6 operations per element and step, over 3 steps. Tolerances are
  // relative to the quantities that enter each result, not to the result itself (m can
  // cancel to nearly 0): m within 1e-6 * max|g|, v within 1e-6 * max|g|^2, the master
  // weight within 2e-6 * (|p| + lr * t).
  const std::vector<float> p0 = {1.0f, -0.5f, 0.25f, 3.0f, -2.0f, 0.0f, 1e-3f};
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f, 0.3f, 1.5f, -1e-3f, 0.5f, 2.0f},
                                                 {-0.3f, 0.1f, 0.3f, 1.0f, 0.0f, -0.5f, 1e-5f},
                                                 {0.2f, 0.2f, -0.1f, -3.0f, 4.0f, 0.25f, 0.0f}};
  const double max_g = 4.0;
  const AdamWConfig config{
      .lr = 0.01, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (const bool decay : {true, false}) {
    for (const float grad_scale : {1.0f, 0.375f}) {
      State s(p0);
      DoubleReference ref{{p0.begin(), p0.end()},
                          std::vector<double>(p0.size(), 0.0),
                          std::vector<double>(p0.size(), 0.0)};
      for (int64_t t = 1; t <= 3; ++t) {
        const auto& g = grads[static_cast<size_t>(t - 1)];
        adamw_update(s.shard(g), decay, config, t, grad_scale);
        ref.step(g, config, t, decay, grad_scale);
        for (size_t i = 0; i < p0.size(); ++i) {
          SCOPED_TRACE(::testing::Message() << "element " << i << " step " << t << " decay "
                                            << decay << " grad_scale " << grad_scale);
          EXPECT_NEAR(s.m[i], ref.m[i], 1e-6 * max_g);
          EXPECT_NEAR(s.v[i], ref.v[i], 1e-6 * max_g * max_g);
          EXPECT_NEAR(s.p[i], ref.p[i],
                      2e-6 * (std::abs(ref.p[i]) + config.lr * static_cast<double>(t)));
        }
      }
    }
  }
}

TEST(AdamW, FirstStepMovesEachWeightByAboutLrAgainstItsGradientSign) {
  // With m = v = 0, step 1 gives mhat = g, vhat = g^2: p -= lr * g / (|g| + eps).
  State s({1.0f, 1.0f, 1.0f});
  const std::vector<float> g = {2.0f, -0.5f, 0.0f};
  adamw_update(s.shard(g), false, {.lr = 0.01}, 1, 1.0f);
  EXPECT_NEAR(s.p[0], 0.99f, 1e-7f);
  EXPECT_NEAR(s.p[1], 1.01f, 1e-7f);
  EXPECT_EQ(s.p[2], 1.0f);  // zero gradient, no decay: untouched
}

TEST(AdamW, DecayRangesAreFlatBufferCoordinatesAndDecayOnlyTheirElements) {
  // Zero gradients leave m = v = 0 and the Adam term 0 / eps = 0, so a decayed element
  // becomes exactly p * fp32(1 - lr * wd) and any other keeps its value.
  const size_t kOffset = 5, kCount = 10;  // this rank owns flat [5, 15)
  std::vector<float> p0(kCount);
  for (size_t j = 0; j < kCount; ++j) p0[j] = 1.0f + 0.125f * static_cast<float>(j);
  State s(p0);
  const std::vector<float> zero(kCount, 0.0f);
  const Range decay[] = {{0, 3}, {7, 9}, {12, 30}};  // overlaps flat 7, 8, 12, 13, 14
  const AdamWConfig config{.lr = 0.5, .weight_decay = 0.5};
  adamw_step(s.shard(zero, kOffset), decay, config, 1, 1.0f);
  const float factor = static_cast<float>(1.0 - 0.5 * 0.5);
  for (size_t j = 0; j < kCount; ++j) {
    const size_t flat = kOffset + j;
    const bool decayed = flat == 7 || flat == 8 || flat >= 12;
    EXPECT_EQ(s.p[j], decayed ? p0[j] * factor : p0[j]) << "flat index " << flat;
  }
}

TEST(AdamW, NoDecayRangesMeansNoDecayAndDecayAllEqualsTheKernelWithDecay) {
  const auto p0 = random_values(97, 1, 1.0f);
  const auto g = random_values(97, 2, 1.0f);
  State none(p0), all(p0), kernel_off(p0), kernel_on(p0);
  const AdamWConfig config{.lr = 1e-2, .weight_decay = 0.3};
  adamw_step(none.shard(g, 40), {}, config, 4, 1.0f);
  const Range everything[] = {{0, 1000}};
  adamw_step(all.shard(g, 40), everything, config, 4, 1.0f);
  adamw_update(kernel_off.shard(g), false, config, 4, 1.0f);
  adamw_update(kernel_on.shard(g), true, config, 4, 1.0f);
  EXPECT_TRUE(same_bits(none.p, kernel_off.p));
  EXPECT_TRUE(same_bits(all.p, kernel_on.p));
  EXPECT_FALSE(same_bits(none.p, all.p));
}

TEST(AdamW, SplittingARangeIntoCallsGivesTheSameBits) {
  for (const size_t n : {size_t{1}, size_t{2}, size_t{17}, size_t{64}, size_t{1009}}) {
    const auto p0 = random_values(n, 3, 0.02f);
    const Range decay[] = {{n / 5, n / 2}, {n / 2 + 1, n}};
    const AdamWConfig config{.lr = 3e-3, .weight_decay = 0.1};
    State whole(p0);
    for (int64_t t = 1; t <= 4; ++t) {
      const auto g = random_values(n, 100 + static_cast<uint32_t>(t), 1.0f);
      adamw_step(whole.shard(g), decay, config, t, 0.5f);
    }
    for (const size_t a : {size_t{0}, size_t{1}, n / 3, n / 2, n - 1, n}) {
      State split(p0);
      for (int64_t t = 1; t <= 4; ++t) {
        const auto g = random_values(n, 100 + static_cast<uint32_t>(t), 1.0f);
        const std::span<const float> gs = g;
        adamw_step({.master = std::span(split.p).first(a),
                    .m = std::span(split.m).first(a),
                    .v = std::span(split.v).first(a),
                    .grad = gs.first(a),
                    .offset = 0},
                   decay, config, t, 0.5f);
        adamw_step({.master = std::span(split.p).subspan(a),
                    .m = std::span(split.m).subspan(a),
                    .v = std::span(split.v).subspan(a),
                    .grad = gs.subspan(a),
                    .offset = a},
                   decay, config, t, 0.5f);
      }
      EXPECT_TRUE(same_bits(split.p, whole.p)) << "n " << n << " split at " << a;
      EXPECT_TRUE(same_bits(split.m, whole.m)) << "n " << n << " split at " << a;
      EXPECT_TRUE(same_bits(split.v, whole.v)) << "n " << n << " split at " << a;
    }
  }
}

TEST(AdamW, GradScaleMultipliesEachGradientBeforeAnythingElse) {
  const size_t n = 257;
  const auto p0 = random_values(n, 5, 0.02f);
  const auto g = random_values(n, 6, 1.0f);
  const AdamWConfig config{};
  // Any scale: the same as pre-multiplied gradients in fp32 with scale 1.
  std::vector<float> pre(n);
  for (size_t i = 0; i < n; ++i) pre[i] = g[i] * 0.3f;
  State scaled(p0), premultiplied(p0);
  adamw_update(scaled.shard(g), true, config, 2, 0.3f);
  adamw_update(premultiplied.shard(pre), true, config, 2, 1.0f);
  EXPECT_TRUE(same_bits(scaled.p, premultiplied.p));
  EXPECT_TRUE(same_bits(scaled.v, premultiplied.v));
  // A power-of-two loss scale undoes exactly: grads * 1024 with grad_scale 1/1024.
  std::vector<float> loss_scaled(n);
  for (size_t i = 0; i < n; ++i) loss_scaled[i] = g[i] * 1024.0f;
  State unscaled(p0), plain(p0);
  adamw_update(unscaled.shard(loss_scaled), true, config, 2, 1.0f / 1024.0f);
  adamw_update(plain.shard(g), true, config, 2, 1.0f);
  EXPECT_TRUE(same_bits(unscaled.p, plain.p));
  EXPECT_TRUE(same_bits(unscaled.m, plain.m));
}

TEST(AdamW, DispatchedAndPortablePathsGiveTheSameBits) {
  SCOPED_TRACE(std::string("dispatched path: ") + std::string(adamw_kernel_path()));
  const size_t n = 10007;
  auto p0 = random_values(n, 7, 0.05f);
  p0[0] = 0.0f;
  p0[1] = -0.0f;
  p0[2] = std::numeric_limits<float>::denorm_min();
  p0[3] = 1e30f;
  State fast(p0), slow(p0);
  for (int64_t t = 1; t <= 5; ++t) {
    auto g = random_values(n, 200 + static_cast<uint32_t>(t), 2.0f);
    g[4] = std::numeric_limits<float>::min();
    g[5] = 1e-30f;
    g[6] = 0.0f;
    adamw_update(fast.shard(g), t % 2 == 1, {.lr = 1e-3 * static_cast<double>(t)}, t, 0.75f);
    portable::adamw_update(slow.shard(g), t % 2 == 1, {.lr = 1e-3 * static_cast<double>(t)}, t,
                           0.75f);
  }
  EXPECT_TRUE(same_bits(fast.p, slow.p));
  EXPECT_TRUE(same_bits(fast.m, slow.m));
  EXPECT_TRUE(same_bits(fast.v, slow.v));
}

TEST(AdamW, EmptyShardIsANoOp) {
  State s({});
  adamw_step(s.shard({}, 12), std::vector<Range>{{0, 100}}, {}, 1, 1.0f);
  adamw_update(s.shard({}), true, {}, 1, 1.0f);
}

TEST(AdamW, RejectsMismatchedSpansNamingEveryLength) {
  State s({1.0f, 2.0f, 3.0f});
  const std::vector<float> g = {1.0f, 2.0f};
  try {
    adamw_update(s.shard(g), false, {}, 1, 1.0f);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("master 3, m 3, v 3, grad 2"), std::string::npos)
        << e.what();
  }
}

TEST(AdamW, RejectsStepBelowOneAndNonFiniteGradScale) {
  State s({1.0f});
  const std::vector<float> g = {1.0f};
  EXPECT_THROW(adamw_update(s.shard(g), false, {}, 0, 1.0f), InvalidArgument);
  EXPECT_THROW(adamw_update(s.shard(g), false, {}, 1, std::numeric_limits<float>::infinity()),
               InvalidArgument);
  EXPECT_THROW(adamw_update(s.shard(g), false, {}, 1, std::nanf("")), InvalidArgument);
  EXPECT_EQ(s.p[0], 1.0f);  // nothing ran
}

TEST(AdamW, RejectsUnsortedOverlappingOrReversedDecayRanges) {
  State s({1.0f, 2.0f, 3.0f, 4.0f});
  const std::vector<float> g(4, 1.0f);
  const std::vector<std::vector<Range>> bad = {{{2, 4}, {0, 1}}, {{0, 3}, {2, 4}}, {{3, 1}}};
  for (const auto& ranges : bad) {
    try {
      adamw_step(s.shard(g), ranges, {}, 1, 1.0f);
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("sorted and non-overlapping"), std::string::npos)
          << e.what();
    }
  }
  const Range adjacent[] = {{0, 2}, {2, 4}};  // touching is fine
  EXPECT_NO_THROW(adamw_step(s.shard(g), adjacent, {}, 1, 1.0f));
}

TEST(AdamW, RejectsInvalidHyperparametersNamingTheField) {
  const std::vector<std::pair<AdamWConfig, std::string>> cases = {
      {{.lr = -1e-3}, "lr = -0.001"},
      {{.beta1 = 1.0}, "beta1 = 1"},
      {{.beta2 = -0.1}, "beta2 = -0.1"},
      {{.eps = 0.0}, "eps = 0"},
      {{.weight_decay = -0.1}, "weight_decay = -0.1"},
      {{.lr = std::numeric_limits<double>::quiet_NaN()}, "lr = nan"},
  };
  for (const auto& [config, field] : cases) {
    try {
      validate(config);
      ADD_FAILURE() << "expected InvalidArgument for " << field;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(validate(AdamWConfig{}));
  EXPECT_NO_THROW(validate({.lr = 0.0, .beta1 = 0.0, .beta2 = 0.0, .weight_decay = 0.0}));
}

TEST(AdamW, DefaultsAreThePeersHyperparameters) {
  const AdamWConfig c;
  EXPECT_EQ(c.lr, 1e-3);
  EXPECT_EQ(c.beta1, 0.9);
  EXPECT_EQ(c.beta2, 0.95);
  EXPECT_EQ(c.eps, 1e-8);
  EXPECT_EQ(c.weight_decay, 0.1);
}

}  // namespace
}  // namespace zerodp
