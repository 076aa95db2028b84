// The Llama family's layers: RMSNorm, rotary embedding (rotate-half) and SwiGLU, forward
// against the formulas in double, backward against central finite differences, the "backward
// adds" convention, the pinned rotary table, and shape checks. Tolerances as in
// layers_test.cc: the step's truncation error for non-linear layers, rounding for linear ones.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "nn/grad_check.h"
#include "nn/layers.h"

namespace zerodp {
namespace {

using gradcheck::expect_gradient_matches;
using gradcheck::normal_vector;
using gradcheck::Tolerance;
using gradcheck::weighted_sum;

// RMSNorm and SwiGLU are smooth: a step of 1e-2 keeps h^2 f''' / 6 near 1e-5 for unit-scale
// inputs, and the rounding term ~1e-7 |out| / 1e-2 stays below it.
constexpr Tolerance kSmooth{1e-2f, 2e-3, 2e-3};
// The rotation is linear in its input: no truncation error.
constexpr Tolerance kLinear{0.5f, 2e-5, 2e-5};

// ---------------------------------------------------------------- RMSNorm

struct RmsCase {
  size_t rows = 6, C = 20;
  float eps = 1e-5f;
  std::vector<float> inp = normal_vector(rows * C, 31, 1.5f, 0.3f);
  std::vector<float> weight = normal_vector(C, 32, 0.5f, 1.0f);
  std::vector<float> dout = normal_vector(rows * C, 33);
  std::vector<float> out = std::vector<float>(rows * C);
  std::vector<float> rstd = std::vector<float>(rows);
  void forward() { rmsnorm_forward(out, rstd, inp, weight, rows, C, eps); }
};

TEST(RmsNorm, ForwardDividesEachRowByItsRootMeanSquare) {
  RmsCase k;
  k.forward();
  for (size_t r = 0; r < k.rows; ++r) {
    double sq = 0;
    for (size_t i = 0; i < k.C; ++i) sq += std::pow(k.inp[r * k.C + i], 2);
    const double s = 1.0 / std::sqrt(sq / static_cast<double>(k.C) + k.eps);
    EXPECT_NEAR(k.rstd[r], s, 1e-6 * s);
    for (size_t i = 0; i < k.C; ++i) {
      const double want = k.inp[r * k.C + i] * s * k.weight[i];
      EXPECT_NEAR(k.out[r * k.C + i], want, 1e-6 * (std::abs(want) + 1e-3)) << r << "," << i;
    }
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  RmsCase k;
  k.forward();
  std::vector<float> dinp(k.inp.size()), dweight(k.C);
  rmsnorm_backward(dinp, dweight, k.dout, k.inp, k.weight, k.rstd, k.rows, k.C);
  auto objective = [&] {
    k.forward();
    return weighted_sum(k.out, k.dout);
  };
  expect_gradient_matches("dinp", k.inp, dinp, objective, kSmooth);
  expect_gradient_matches("dweight", k.weight, dweight, objective, kSmooth);
  k.forward();
  std::vector<float> again_inp(dinp.size(), 1.0f), again_weight(k.C, -2.0f);
  rmsnorm_backward(again_inp, again_weight, k.dout, k.inp, k.weight, k.rstd, k.rows, k.C);
  for (size_t i = 0; i < dinp.size(); ++i) EXPECT_NEAR(again_inp[i], dinp[i] + 1.0f, 1e-5f);
  for (size_t i = 0; i < k.C; ++i) EXPECT_NEAR(again_weight[i], dweight[i] - 2.0f, 1e-5f);
}

TEST(RmsNorm, RejectsMismatchedBuffers) {
  RmsCase k;
  std::vector<float> short_weight(k.C - 1);
  EXPECT_THROW(rmsnorm_forward(k.out, k.rstd, k.inp, short_weight, k.rows, k.C, k.eps),
               InvalidArgument);
}

// ---------------------------------------------------------------- Rotary embedding

// The table as the pinned recipe says: fp32 inverse frequencies, one fp32 multiply for the
// angle, cos and sin rounded once from double.
TEST(Rope, TheTableIsThePinnedRecipe) {
  const size_t T = 9, HS = 8;
  const float theta = 10000.0f;
  const RopeTable t = rope_table(T, HS, theta);
  ASSERT_EQ(t.half, 4u);
  for (size_t p = 0; p < T; ++p) {
    for (size_t i = 0; i < t.half; ++i) {
      const auto inv = static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / 8.0));
      const float angle = static_cast<float>(p) * inv;
      EXPECT_EQ(t.cos[p * 4 + i], static_cast<float>(std::cos(static_cast<double>(angle))));
      EXPECT_EQ(t.sin[p * 4 + i], static_cast<float>(std::sin(static_cast<double>(angle))));
    }
  }
  // Position 0 is the identity; the first pair turns by one radian per position.
  EXPECT_EQ(t.cos[0], 1.0f);
  EXPECT_EQ(t.sin[0], 0.0f);
  EXPECT_EQ(t.sin[4], static_cast<float>(std::sin(1.0)));
  EXPECT_THROW(rope_table(T, 7, theta), InvalidArgument);
  EXPECT_THROW(rope_table(T, 8, 1.0f), InvalidArgument);
}

struct RopeCase {
  size_t B = 2, T = 5, heads = 3, HS = 6;
  RopeTable table = rope_table(8, 6, 10000.0f);
  std::vector<float> inp = normal_vector(B * T * heads * HS, 41);
  std::vector<float> dout = normal_vector(B * T * heads * HS, 42);
  std::vector<float> out = std::vector<float>(B * T * heads * HS);
  void forward() { rope_forward(out, inp, table, B, T, heads, HS); }
};

// Rotate-half: element i pairs with i + HS/2 (not 2i with 2i + 1), each pair turned by its
// angle, so every pair keeps its length.
TEST(Rope, ForwardTurnsEachHalfPairByItsAngle) {
  RopeCase k;
  k.forward();
  const size_t h = k.HS / 2;
  for (size_t b = 0; b < k.B; ++b) {
    for (size_t t = 0; t < k.T; ++t) {
      for (size_t n = 0; n < k.heads; ++n) {
        const size_t at = ((b * k.T + t) * k.heads + n) * k.HS;
        for (size_t i = 0; i < h; ++i) {
          const double c = k.table.cos[t * h + i], s = k.table.sin[t * h + i];
          const double x = k.inp[at + i], y = k.inp[at + i + h];
          EXPECT_NEAR(k.out[at + i], x * c - y * s, 1e-6);
          EXPECT_NEAR(k.out[at + i + h], y * c + x * s, 1e-6);
          EXPECT_NEAR(std::hypot(k.out[at + i], k.out[at + i + h]), std::hypot(x, y), 1e-5);
        }
      }
    }
  }
}

TEST(Rope, BackwardMatchesFiniteDifferencesAndAccumulates) {
  RopeCase k;
  std::vector<float> dinp(k.inp.size());
  rope_backward(dinp, k.dout, k.table, k.B, k.T, k.heads, k.HS);
  auto objective = [&] {
    k.forward();
    return weighted_sum(k.out, k.dout);
  };
  expect_gradient_matches("dinp", k.inp, dinp, objective, kLinear);
  std::vector<float> again(dinp.size(), 0.25f);
  rope_backward(again, k.dout, k.table, k.B, k.T, k.heads, k.HS);
  for (size_t i = 0; i < dinp.size(); ++i) EXPECT_NEAR(again[i], dinp[i] + 0.25f, 1e-6f);
}

TEST(Rope, RefusesATableOfAnotherShapeOrTooFewPositions) {
  RopeCase k;
  const RopeTable short_table = rope_table(4, 6, 10000.0f);
  EXPECT_THROW(rope_forward(k.out, k.inp, short_table, k.B, k.T, k.heads, k.HS), InvalidArgument);
  const RopeTable other_head = rope_table(8, 4, 10000.0f);
  EXPECT_THROW(rope_forward(k.out, k.inp, other_head, k.B, k.T, k.heads, k.HS), InvalidArgument);
}

// ---------------------------------------------------------------- SwiGLU

TEST(SwiGlu, ForwardIsSiluOfTheGateTimesUp) {
  const std::vector<float> gate = normal_vector(50, 51, 3.0f);
  const std::vector<float> up = normal_vector(50, 52);
  std::vector<float> out(50);
  swiglu_forward(out, gate, up);
  for (size_t i = 0; i < out.size(); ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(out[i], want, 1e-6 * (std::abs(want) + 1e-3)) << i;
  }
}

TEST(SwiGlu, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::vector<float> gate = normal_vector(40, 53, 2.0f);
  std::vector<float> up = normal_vector(40, 54);
  const std::vector<float> dout = normal_vector(40, 55);
  std::vector<float> out(40), dgate(40), dup(40);
  swiglu_backward(dgate, dup, dout, gate, up);
  auto objective = [&] {
    swiglu_forward(out, gate, up);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("dgate", gate, dgate, objective, kSmooth);
  expect_gradient_matches("dup", up, dup, objective, kSmooth);
  std::vector<float> again_gate(40, 1.0f), again_up(40, -1.0f);
  swiglu_backward(again_gate, again_up, dout, gate, up);
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_NEAR(again_gate[i], dgate[i] + 1.0f, 1e-6f);
    EXPECT_NEAR(again_up[i], dup[i] - 1.0f, 1e-6f);
  }
}

// ---------------------------------------------------------------- Grouped-query sharing

// 6 query heads over 2 kv heads: heads 0-2 read kv head 0, heads 3-5 kv head 1.
TEST(RepeatKv, EachGroupReadsItsKvHeadAndBackwardSumsTheGroup) {
  const size_t rows = 3, heads = 6, kv = 2, HS = 4;
  std::vector<float> inp = normal_vector(rows * kv * HS, 71);
  std::vector<float> out(rows * heads * HS);
  repeat_kv_forward(out, inp, rows, heads, kv, HS);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t h = 0; h < heads; ++h) {
      for (size_t i = 0; i < HS; ++i) {
        EXPECT_EQ(out[(r * heads + h) * HS + i], inp[(r * kv + h / 3) * HS + i]);
      }
    }
  }
  const std::vector<float> dout = normal_vector(out.size(), 72);
  std::vector<float> dinp(inp.size(), 0.5f);
  repeat_kv_backward(dinp, dout, rows, heads, kv, HS);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t g = 0; g < kv; ++g) {
      for (size_t i = 0; i < HS; ++i) {
        float want = 0.5f;
        for (size_t h = g * 3; h < g * 3 + 3; ++h) want += dout[(r * heads + h) * HS + i];
        EXPECT_FLOAT_EQ(dinp[(r * kv + g) * HS + i], want);
      }
    }
  }
  EXPECT_THROW(repeat_kv_forward(out, inp, rows, heads, 4, HS), InvalidArgument);
}

// ---------------------------------------------------------------- Head, in blocks of rows

// Rows past one block and a short last block (2 x 64 + 17), some targets ignored.
struct HeadCase {
  size_t rows = 2 * kHeadBlockRows + 17, C = 24, V = 300;
  std::vector<float> inp = normal_vector(rows * C, 61);
  std::vector<float> weight = normal_vector(V * C, 62, 0.2f);
  std::vector<int32_t> targets = [this] {
    std::vector<int32_t> t(rows);
    for (size_t r = 0; r < rows; ++r) {
      t[r] = r % 11 == 3 ? kIgnoreTarget : static_cast<int32_t>((r * 37) % V);
    }
    return t;
  }();
  std::vector<float> scratch = std::vector<float>(head_cross_entropy_scratch_count(V));
};

// The whole head: every row's logits held at once, then the loss and its gradient.
float whole_head(const HeadCase& k, std::vector<float>& dinp, std::vector<float>& dweight,
                 float dloss) {
  std::vector<float> logits(k.rows * k.V), dlogits(k.rows * k.V);
  linear_forward(logits, k.inp, k.weight, {}, k.rows, k.C, k.V, GemmCompute::kFP32);
  const float loss = cross_entropy_forward_backward(dlogits, logits, k.targets, k.rows, k.V, dloss);
  linear_backward(dinp, dweight, {}, dlogits, k.inp, k.weight, k.rows, k.C, k.V,
                  GemmCompute::kFP32);
  return loss;
}

TEST(HeadCrossEntropy, InBlocksIsTheWholeHeadsLossAndGradients) {
  HeadCase k;
  std::vector<float> dinp(k.rows * k.C), dweight(k.V * k.C);
  std::vector<float> want_dinp(dinp.size()), want_dweight(dweight.size());
  const float loss = head_cross_entropy(dinp, dweight, k.scratch, k.inp, k.weight, k.targets,
                                        k.rows, k.C, k.V, GemmCompute::kFP32, 0.5f);
  const float want = whole_head(k, want_dinp, want_dweight, 0.5f);
  EXPECT_NEAR(loss, want, 1e-6 * want);
  for (size_t i = 0; i < dinp.size(); ++i) {
    EXPECT_NEAR(dinp[i], want_dinp[i], 1e-6 + 1e-5 * std::abs(want_dinp[i])) << "dinp " << i;
  }
  for (size_t i = 0; i < dweight.size(); ++i) {
    EXPECT_NEAR(dweight[i], want_dweight[i], 1e-6 + 1e-5 * std::abs(want_dweight[i]))
        << "dweight " << i;
  }
  // The loss alone is the same loss, bit for bit, and touches no gradient.
  HeadCase again;
  EXPECT_EQ(head_cross_entropy({}, {}, again.scratch, again.inp, again.weight, again.targets,
                               again.rows, again.C, again.V, GemmCompute::kFP32),
            head_cross_entropy({}, {}, k.scratch, k.inp, k.weight, k.targets, k.rows, k.C, k.V,
                               GemmCompute::kFP32));
}

TEST(HeadCrossEntropy, BackwardMatchesFiniteDifferences) {
  HeadCase k;
  k.rows = kHeadBlockRows + 5;
  k.C = 6;
  k.V = 40;
  k.inp = normal_vector(k.rows * k.C, 63);
  k.weight = normal_vector(k.V * k.C, 64, 0.3f);
  k.targets.resize(k.rows);
  for (size_t r = 0; r < k.rows; ++r) k.targets[r] = static_cast<int32_t>((r * 7) % k.V);
  k.scratch.resize(head_cross_entropy_scratch_count(k.V));
  std::vector<float> dinp(k.rows * k.C), dweight(k.V * k.C);
  (void)head_cross_entropy(dinp, dweight, k.scratch, k.inp, k.weight, k.targets, k.rows, k.C, k.V,
                           GemmCompute::kFP32);
  auto objective = [&] {
    return static_cast<double>(head_cross_entropy({}, {}, k.scratch, k.inp, k.weight, k.targets,
                                                  k.rows, k.C, k.V, GemmCompute::kFP32));
  };
  // The loss is a mean over 69 rows, so each input moves it little: a small absolute floor.
  constexpr Tolerance kMean{1e-2f, 2e-5, 2e-3};
  expect_gradient_matches("dinp", k.inp, dinp, objective, kMean, 7);
  expect_gradient_matches("dweight", k.weight, dweight, objective, kMean, 5);
}

TEST(HeadCrossEntropy, AddsIntoItsGradientsAndRefusesHalfABackward) {
  HeadCase k;
  std::vector<float> dinp(k.rows * k.C), dweight(k.V * k.C);
  (void)head_cross_entropy(dinp, dweight, k.scratch, k.inp, k.weight, k.targets, k.rows, k.C, k.V,
                           GemmCompute::kFP32);
  std::vector<float> a_inp(dinp.size(), 1.0f), a_weight(dweight.size(), 1.0f);
  (void)head_cross_entropy(a_inp, a_weight, k.scratch, k.inp, k.weight, k.targets, k.rows, k.C, k.V,
                           GemmCompute::kFP32);
  for (size_t i = 0; i < dinp.size(); ++i) EXPECT_NEAR(a_inp[i], dinp[i] + 1.0f, 1e-5f);
  for (size_t i = 0; i < dweight.size(); i += 13) {
    EXPECT_NEAR(a_weight[i], dweight[i] + 1.0f, 1e-5f);
  }
  EXPECT_THROW(head_cross_entropy(dinp, {}, k.scratch, k.inp, k.weight, k.targets, k.rows, k.C, k.V,
                                  GemmCompute::kFP32),
               InvalidArgument);
  std::vector<float> small(k.scratch.size() - 1);
  EXPECT_THROW(head_cross_entropy({}, {}, small, k.inp, k.weight, k.targets, k.rows, k.C, k.V,
                                  GemmCompute::kFP32),
               InvalidArgument);
}

}  // namespace
}  // namespace zerodp
