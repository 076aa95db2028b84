// Causal self-attention: forward against a direct double computation, backward against
// finite differences, causality in both directions, and the "backward adds" convention.
#include "nn/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "nn/grad_check.h"
#include "tensor/dtype.h"

namespace zerodp {
namespace {

using gradcheck::expect_gradient_matches;
using gradcheck::normal_vector;
using gradcheck::Tolerance;
using gradcheck::weighted_sum;

struct AttentionCase {
  AttentionCase() = default;
  explicit AttentionCase(AttentionDims dims) : d(dims) {}
  AttentionDims d{.B = 2, .T = 5, .C = 12, .NH = 3};  // odd T, head size 4
  std::vector<float> qkv = normal_vector(d.B * d.T * 3 * d.C, 61);
  std::vector<float> dout = normal_vector(d.B * d.T * d.C, 62);
  std::vector<float> out = std::vector<float>(d.B * d.T * d.C);
  std::vector<float> saved = std::vector<float>(attention_saved_count(d));
  std::vector<float> scratch = std::vector<float>(attention_scratch_count(d));
  void forward() { attention_forward(out, saved, scratch, qkv, d, GemmCompute::kFP32); }
  void backward(std::vector<float>& dqkv) {
    attention_backward(dqkv, scratch, dout, qkv, saved, d, GemmCompute::kFP32);
  }
};

// The textbook definition, in double, one (b, t, h) at a time.
std::vector<double> reference_attention(const std::vector<float>& qkv, const AttentionDims& d) {
  const size_t C = d.C, hs = d.head_size();
  std::vector<double> out(d.B * d.T * C);
  for (size_t b = 0; b < d.B; ++b) {
    for (size_t h = 0; h < d.NH; ++h) {
      for (size_t t = 0; t < d.T; ++t) {
        const float* q = &qkv[(b * d.T + t) * 3 * C + h * hs];
        std::vector<double> w(t + 1);
        double wmax = -1e300, sum = 0.0;
        for (size_t u = 0; u <= t; ++u) {
          const float* k = &qkv[(b * d.T + u) * 3 * C + C + h * hs];
          double dot = 0.0;
          for (size_t i = 0; i < hs; ++i) dot += double(q[i]) * k[i];
          w[u] = dot / std::sqrt(double(hs));
          wmax = std::max(wmax, w[u]);
        }
        for (size_t u = 0; u <= t; ++u) sum += (w[u] = std::exp(w[u] - wmax));
        for (size_t i = 0; i < hs; ++i) {
          double acc = 0.0;
          for (size_t u = 0; u <= t; ++u)
            acc += w[u] / sum * qkv[(b * d.T + u) * 3 * C + 2 * C + h * hs + i];
          out[(b * d.T + t) * C + h * hs + i] = acc;
        }
      }
    }
  }
  return out;
}

void expect_forward_matches_the_definition(AttentionCase k) {
  k.forward();
  const std::vector<double> want = reference_attention(k.qkv, k.d);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(k.out[i], want[i], 2e-6) << i;
}

TEST(Attention, ForwardMatchesTheDefinition) { expect_forward_matches_the_definition({}); }

// T = 150 runs three query blocks (64, 64, 22 rows) whose key ranges end at 64, 128, 150.
constexpr AttentionDims kLongDims{.B = 1, .T = 150, .C = 8, .NH = 2};

TEST(Attention, LongSequenceMatchesTheDefinitionAcrossQueryBlocks) {
  expect_forward_matches_the_definition(AttentionCase(kLongDims));
}

TEST(Attention, StateAndWorkspaceGrowLinearlyInT) {
  const AttentionDims d{.B = 2, .T = 1024, .C = 64, .NH = 4};
  EXPECT_EQ(attention_saved_count(d), 2u * 4 * 1024 * 2);  // (max, 1/sum) per query row
  EXPECT_LT(attention_scratch_count(d), d.T * d.T / 4);    // two tiles of 64 query rows
}

TEST(Attention, SingleStepReturnsItsValue) {
  AttentionCase k;
  k.d.T = 1;
  k.qkv = normal_vector(k.d.B * 3 * k.d.C, 63);
  k.out.resize(k.d.B * k.d.C);
  k.saved.resize(attention_saved_count(k.d));
  k.scratch.resize(attention_scratch_count(k.d));
  k.forward();
  for (size_t b = 0; b < k.d.B; ++b) {
    for (size_t c = 0; c < k.d.C; ++c)
      EXPECT_EQ(k.out[b * k.d.C + c], k.qkv[b * 3 * k.d.C + 2 * k.d.C + c]);
  }
}

// Non-linear through the softmax: h = 1e-2 on inputs of spread 1 keeps truncation
// (h^2/6 * |f'''| * |dout|) and rounding (6e-8 * |out| * |dout| * T / 2h) each near 5e-5.
constexpr Tolerance kAttentionTol{1e-2f, 3e-4, 1e-3};

void expect_backward_matches_finite_differences(AttentionCase k, size_t every = 1) {
  k.forward();
  std::vector<float> dqkv(k.qkv.size());
  k.backward(dqkv);
  auto objective = [&] {
    k.forward();
    return weighted_sum(k.out, k.dout);
  };
  expect_gradient_matches("dqkv", k.qkv, dqkv, objective, kAttentionTol, every);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  expect_backward_matches_finite_differences({});
}

TEST(Attention, LongSequenceBackwardMatchesFiniteDifferences) {
  expect_backward_matches_finite_differences(AttentionCase(kLongDims));
}

TEST(Attention, BackwardAccumulates) {
  AttentionCase k;
  k.forward();
  std::vector<float> fresh(k.qkv.size());
  k.backward(fresh);
  const auto prefill = normal_vector(k.qkv.size(), 64);
  std::vector<float> got = prefill;
  k.backward(got);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], prefill[i] + fresh[i],
                1e-6f * (std::abs(prefill[i]) + std::abs(fresh[i]) + 1e-3f))
        << i;
  }
}

TEST(Attention, FutureTokensDoNotChangeEarlierOutputs) {
  AttentionCase k;
  k.forward();
  const std::vector<float> before = k.out;
  const size_t b = 1, t0 = 3, C = k.d.C, T = k.d.T;
  for (size_t c = 0; c < 3 * C; ++c) k.qkv[(b * T + t0) * 3 * C + c] += 1.5f;  // its q, k and v
  k.forward();
  for (size_t bb = 0; bb < k.d.B; ++bb) {
    for (size_t t = 0; t < T; ++t) {
      const bool may_change = bb == b && t >= t0;
      const int same =
          std::memcmp(&before[(bb * T + t) * C], &k.out[(bb * T + t) * C], C * sizeof(float));
      if (may_change) {
        if (t == t0) {
          EXPECT_NE(same, 0) << "t=" << t;  // its own output sees the change
        }
      } else {
        EXPECT_EQ(same, 0) << "b=" << bb << " t=" << t << " changed bits";
      }
    }
  }
}

TEST(Attention, GradientFlowsOnlyToThePast) {
  AttentionCase k;
  k.forward();
  const size_t t0 = 2, C = k.d.C, T = k.d.T;
  std::fill(k.dout.begin(), k.dout.end(), 0.0f);
  for (size_t b = 0; b < k.d.B; ++b) {
    for (size_t c = 0; c < C; ++c) k.dout[(b * T + t0) * C + c] = 1.0f;
  }
  std::vector<float> dqkv(k.qkv.size());
  k.backward(dqkv);
  for (size_t b = 0; b < k.d.B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      double norm = 0.0;
      for (size_t c = 0; c < 3 * C; ++c) norm += std::abs(dqkv[(b * T + t) * 3 * C + c]);
      if (t > t0) {
        EXPECT_EQ(norm, 0.0) << "b=" << b << " t=" << t;
      } else {
        EXPECT_GT(norm, 0.0) << "b=" << b << " t=" << t;
      }
    }
  }
}

TEST(Attention, EmptyBatchOrSequenceIsANoOp) {
  for (AttentionDims d : {AttentionDims{.B = 0, .T = 5, .C = 12, .NH = 3},
                          AttentionDims{.B = 2, .T = 0, .C = 12, .NH = 3}}) {
    std::vector<float> none;
    std::vector<float> scratch(attention_scratch_count(d));
    EXPECT_NO_THROW(attention_forward(none, none, scratch, none, d, GemmCompute::kFP32));
    EXPECT_NO_THROW(attention_backward(none, scratch, none, none, none, d, GemmCompute::kFP32));
  }
}

TEST(Attention, RejectsHeadsThatDoNotDivideChannels) {
  AttentionCase k;
  k.d.NH = 5;
  try {
    k.forward();
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "attention_forward: C=12 channels do not split into NH=5 heads; use NH >= 1 "
                 "dividing C");
  }
  k.d.NH = 0;
  EXPECT_THROW(k.forward(), InvalidArgument);
}

TEST(Attention, RejectsWronglySizedState) {
  AttentionCase k;
  k.saved.pop_back();
  EXPECT_THROW(k.forward(), InvalidArgument);
  k.saved.push_back(0.0f);
  k.forward();
  k.scratch.pop_back();
  std::vector<float> dqkv(k.qkv.size());
  EXPECT_THROW(k.backward(dqkv), InvalidArgument);
}

// Four sequences of 150 positions, two heads: three query blocks, and pairs in two groups of
// batched products (3 sequences, then 1), so every loop of the batched path runs.
constexpr AttentionDims kGroupedDims{.B = 4, .T = 150, .C = 8, .NH = 2};

TEST(Attention, GroupedPairsMatchTheDefinition) {
  expect_forward_matches_the_definition(AttentionCase(kGroupedDims));
}

TEST(Attention, GroupedPairsBackwardMatchesFiniteDifferences) {
  // Every 7th of its 14,400 inputs: 3 or 4 of each position's q, k and v, and, 7 being prime to
  // 3 C = 24, every channel at many positions of every pair; a seventh of the cost (all of them
  // took 111 s under ASan, the longest test in CI).
  expect_backward_matches_finite_differences(AttentionCase(kGroupedDims), 7);
}

TEST(Attention, ScratchHoldsAGroupOfPairsWithinItsBudget) {
  // GPT small: 16 of its 64 pairs per batched call, two (64, 64) tiles each.
  EXPECT_EQ(attention_scratch_count({.B = 16, .T = 64, .C = 128, .NH = 4}), 2u * 16 * 64 * 64);
  // One sequence: no more pairs than it has heads.
  EXPECT_EQ(attention_scratch_count({.B = 1, .T = 64, .C = 128, .NH = 4}), 2u * 4 * 64 * 64);
  // Long sequences: one pair at a time.
  EXPECT_EQ(attention_scratch_count({.B = 8, .T = 1024, .C = 768, .NH = 12}), 2u * 64 * 1024);
}

// qkv rounded to bf16 values, as fp32 and as bf16.
struct Bf16Qkv {
  std::vector<float> widened;
  std::vector<BFloat16> narrow;
  explicit Bf16Qkv(const std::vector<float>& qkv) : widened(qkv.size()), narrow(qkv.size()) {
    convert(std::span<const float>(qkv), std::span<BFloat16>(narrow));
    convert(std::span<const BFloat16>(narrow), std::span<float>(widened));
  }
};

TEST(AttentionBf16, ForwardIsTheFp32OverloadsOutRounded) {
  for (const AttentionDims& d : {AttentionCase().d, kLongDims, kGroupedDims}) {
    AttentionCase k(d);
    const Bf16Qkv in(k.qkv);
    attention_forward(k.out, k.saved, k.scratch, in.widened, d, GemmCompute::kBF16);
    std::vector<BFloat16> want(k.out.size()), got(k.out.size());
    convert(std::span<const float>(k.out), std::span<BFloat16>(want));
    std::vector<float> saved(k.saved.size());
    attention_forward(got, saved, k.scratch, in.narrow, d, GemmCompute::kBF16);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(BFloat16)))
        << "T=" << d.T;
    ASSERT_EQ(0, std::memcmp(saved.data(), k.saved.data(), saved.size() * sizeof(float)));
    // And it is attention: near the definition, to bf16's precision.
    const std::vector<double> ref = reference_attention(in.widened, d);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(to_f32(got[i]), ref[i], 3e-2) << i;
  }
}

TEST(AttentionBf16, BackwardIsTheFp32OverloadsBitForBit) {
  for (const AttentionDims& d : {AttentionCase().d, kLongDims, kGroupedDims}) {
    AttentionCase k(d);
    const Bf16Qkv in(k.qkv);
    std::vector<BFloat16> out16(k.out.size());
    attention_forward(out16, k.saved, k.scratch, in.narrow, d, GemmCompute::kBF16);
    const auto prefill = normal_vector(k.qkv.size(), 65);
    std::vector<float> want = prefill, got = prefill;
    attention_backward(want, k.scratch, k.dout, in.widened, k.saved, d, GemmCompute::kBF16);
    attention_backward(got, k.scratch, k.dout, in.narrow, k.saved, d, GemmCompute::kBF16);
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float))) << "T=" << d.T;
    ASSERT_NE(0, std::memcmp(prefill.data(), got.data(), got.size() * sizeof(float)));
  }
}

TEST(AttentionBf16, NeedsBf16Compute) {
  AttentionCase k;
  const Bf16Qkv in(k.qkv);
  std::vector<BFloat16> out16(k.out.size());
  std::vector<float> dqkv(k.qkv.size());
  try {
    attention_forward(out16, k.saved, k.scratch, in.narrow, k.d, GemmCompute::kFP32);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "attention_forward: bf16 qkv needs compute bf16, got fp32; widen qkv to fp32 or "
                 "compute in bf16");
  }
  EXPECT_THROW(
      attention_backward(dqkv, k.scratch, k.dout, in.narrow, k.saved, k.d, GemmCompute::kFP32),
      InvalidArgument);
}

}  // namespace
}  // namespace zerodp
