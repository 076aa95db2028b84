// Causal self-attention: forward against a direct double computation, backward against
// finite differences, causality in both directions, and the "backward adds" convention.
#include "nn/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "nn/grad_check.h"

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

void expect_backward_matches_finite_differences(AttentionCase k) {
  k.forward();
  std::vector<float> dqkv(k.qkv.size());
  k.backward(dqkv);
  auto objective = [&] {
    k.forward();
    return weighted_sum(k.out, k.dout);
  };
  expect_gradient_matches("dqkv", k.qkv, dqkv, objective, kAttentionTol);
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

}  // namespace
}  // namespace zerodp
