// Layer kernels: forward against direct formulas, backward against central finite
// differences, the "backward adds" convention, and shape checks.
//
// Tolerances. The kernels are fp32 and deterministic, so in f(x + h) - f(x - h) every
// output that does not depend on x cancels exactly; what remains is the rounding of the
// outputs that do (~1e-7 relative each) divided by 2h, plus the truncation error
// h^2/6 * f''' for non-linear layers. Each tolerance below says which term it covers.
#include "nn/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "nn/grad_check.h"
#include "tensor/dtype.h"

namespace zerodp {
namespace {

// The layers' own arithmetic, in fp32 products (bf16 products: tests/tensor/gemm_test.cc).
constexpr GemmCompute kFp32 = GemmCompute::kFP32;

using gradcheck::expect_gradient_matches;
using gradcheck::normal_vector;
using gradcheck::Tolerance;
using gradcheck::weighted_sum;

// Linear, encoder and residual are linear in each input, so there is no truncation error
// and a large step (exact in binary) makes the rounding term ~1e-7 * |out| / 0.5.
constexpr Tolerance kLinearInEachInput{0.5f, 2e-5, 2e-5};

// backward(d = prefill) must equal prefill + backward(d = 0) up to the rounding of one add
// (the gemm-based gradients add in a different association: one extra rounding per term).
void expect_accumulates(const std::vector<float>& prefill, const std::vector<float>& fresh,
                        const std::vector<float>& got, const char* name) {
  ASSERT_EQ(prefill.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = prefill[i] + fresh[i];
    EXPECT_NEAR(got[i], want, 1e-6f * (std::abs(prefill[i]) + std::abs(fresh[i]) + 1e-3f))
        << name << "[" << i << "]";
  }
}

// ---------------------------------------------------------------- Linear

struct LinearCase {
  size_t rows = 10, C = 12, OC = 7;  // B=2, T=5
  std::vector<float> inp = normal_vector(rows * C, 1);
  std::vector<float> weight = normal_vector(OC * C, 2, 0.5f);
  std::vector<float> bias = normal_vector(OC, 3);
  std::vector<float> dout = normal_vector(rows * OC, 4);
  std::vector<float> out = std::vector<float>(rows * OC);
};

TEST(Linear, ForwardMatchesDirectSum) {
  LinearCase k;
  linear_forward(k.out, k.inp, k.weight, k.bias, k.rows, k.C, k.OC, kFp32);
  for (size_t r = 0; r < k.rows; ++r) {
    for (size_t o = 0; o < k.OC; ++o) {
      double want = k.bias[o];
      for (size_t i = 0; i < k.C; ++i) want += double(k.inp[r * k.C + i]) * k.weight[o * k.C + i];
      EXPECT_NEAR(k.out[r * k.OC + o], want, 1e-5);
    }
  }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "with bias" : "without bias");
    LinearCase k;
    if (!with_bias) k.bias.clear();
    std::vector<float> dinp(k.inp.size()), dweight(k.weight.size()), dbias(k.bias.size());
    linear_backward(dinp, dweight, dbias, k.dout, k.inp, k.weight, k.rows, k.C, k.OC, kFp32);
    auto objective = [&] {
      linear_forward(k.out, k.inp, k.weight, k.bias, k.rows, k.C, k.OC, kFp32);
      return weighted_sum(k.out, k.dout);
    };
    expect_gradient_matches("dinp", k.inp, dinp, objective, kLinearInEachInput);
    expect_gradient_matches("dweight", k.weight, dweight, objective, kLinearInEachInput);
    expect_gradient_matches("dbias", k.bias, dbias, objective, kLinearInEachInput);
  }
}

TEST(Linear, BackwardAccumulates) {
  LinearCase k;
  std::vector<float> dinp(k.inp.size()), dweight(k.weight.size()), dbias(k.bias.size());
  linear_backward(dinp, dweight, dbias, k.dout, k.inp, k.weight, k.rows, k.C, k.OC, kFp32);
  const auto p_inp = normal_vector(dinp.size(), 5);
  const auto p_weight = normal_vector(dweight.size(), 6);
  const auto p_bias = normal_vector(dbias.size(), 7);
  std::vector<float> a_inp = p_inp, a_weight = p_weight, a_bias = p_bias;
  linear_backward(a_inp, a_weight, a_bias, k.dout, k.inp, k.weight, k.rows, k.C, k.OC, kFp32);
  expect_accumulates(p_inp, dinp, a_inp, "dinp");
  expect_accumulates(p_weight, dweight, a_weight, "dweight");
  expect_accumulates(p_bias, dbias, a_bias, "dbias");
}

// kOverwrite writes dinp whatever it held (NaN here, which any read would spread) and
// still adds into dweight and dbias.
TEST(Linear, OverwritingTheInputGradientIgnoresWhatItHeld) {
  LinearCase k;
  std::vector<float> dinp(k.inp.size()), dweight(k.weight.size()), dbias(k.bias.size());
  linear_backward(dinp, dweight, dbias, k.dout, k.inp, k.weight, k.rows, k.C, k.OC, kFp32);
  const auto p_weight = normal_vector(dweight.size(), 6);
  const auto p_bias = normal_vector(dbias.size(), 7);
  std::vector<float> o_inp(k.inp.size(), std::nanf("")), o_weight = p_weight, o_bias = p_bias;
  linear_backward(o_inp, o_weight, o_bias, k.dout, k.inp, k.weight, k.rows, k.C, k.OC, kFp32,
                  InputGrad::kOverwrite);
  for (size_t i = 0; i < dinp.size(); ++i)
    EXPECT_FLOAT_EQ(o_inp[i], dinp[i]) << "dinp[" << i << "]";
  expect_accumulates(p_weight, dweight, o_weight, "dweight");
  expect_accumulates(p_bias, dbias, o_bias, "dbias");
}

TEST(Linear, EmptyDinpSkipsTheInputGradient) {
  LinearCase k;
  std::vector<float> dweight(k.weight.size()), dbias(k.bias.size());
  std::vector<float> dweight2(k.weight.size()), dbias2(k.bias.size()), dinp(k.inp.size());
  linear_backward({}, dweight, dbias, k.dout, k.inp, k.weight, k.rows, k.C, k.OC, kFp32);
  linear_backward(dinp, dweight2, dbias2, k.dout, k.inp, k.weight, k.rows, k.C, k.OC, kFp32);
  EXPECT_EQ(dweight, dweight2);
  EXPECT_EQ(dbias, dbias2);
}

TEST(Linear, RejectsMismatchedBuffers) {
  LinearCase k;
  std::vector<float> short_weight(k.weight.size() - 1);
  EXPECT_THROW(linear_forward(k.out, k.inp, short_weight, k.bias, k.rows, k.C, k.OC, kFp32),
               InvalidArgument);
  try {
    linear_forward(k.out, k.inp, k.weight, std::vector<float>(3), k.rows, k.C, k.OC, kFp32);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "linear_forward: bias holds 3 elements; (rows=10, C=12, OC=7) needs 7");
  }
}

// ---------------------------------------------------------------- Encoder

struct EncoderCase {
  size_t B = 2, T = 5, C = 12, V = 11, maxT = 7;  // maxT > T: only wpe's first T rows used
  std::vector<int32_t> tokens{3, 1, 4, 1, 5, 9, 2, 6, 5, 3};  // repeats accumulate
  std::vector<float> wte = normal_vector(V * C, 11);
  std::vector<float> wpe = normal_vector(maxT * C, 12);
  std::vector<float> dout = normal_vector(B * T * C, 13);
  std::vector<float> out = std::vector<float>(B * T * C);
};

TEST(Encoder, ForwardAddsTokenAndPositionRows) {
  EncoderCase k;
  encoder_forward(k.out, k.tokens, k.wte, k.wpe, k.B, k.T, k.C, k.V);
  for (size_t bt = 0; bt < k.B * k.T; ++bt) {
    for (size_t i = 0; i < k.C; ++i) {
      EXPECT_EQ(k.out[bt * k.C + i],
                k.wte[size_t(k.tokens[bt]) * k.C + i] + k.wpe[(bt % k.T) * k.C + i]);
    }
  }
}

TEST(Encoder, BackwardMatchesFiniteDifferences) {
  EncoderCase k;
  std::vector<float> dwte(k.wte.size()), dwpe(k.wpe.size());
  encoder_backward(dwte, dwpe, k.dout, k.tokens, k.B, k.T, k.C, k.V);
  auto objective = [&] {
    encoder_forward(k.out, k.tokens, k.wte, k.wpe, k.B, k.T, k.C, k.V);
    return weighted_sum(k.out, k.dout);
  };
  expect_gradient_matches("dwte", k.wte, dwte, objective, kLinearInEachInput);
  expect_gradient_matches("dwpe", k.wpe, dwpe, objective, kLinearInEachInput);
  // Rows of tokens never seen and positions past T receive nothing.
  for (size_t i = 0; i < k.C; ++i) {
    EXPECT_EQ(dwte[0 * k.C + i], 0.0f);
    EXPECT_EQ(dwpe[6 * k.C + i], 0.0f);
  }
}

TEST(Encoder, BackwardAccumulates) {
  EncoderCase k;
  std::vector<float> dwte(k.wte.size()), dwpe(k.wpe.size());
  encoder_backward(dwte, dwpe, k.dout, k.tokens, k.B, k.T, k.C, k.V);
  const auto p_wte = normal_vector(dwte.size(), 14);
  const auto p_wpe = normal_vector(dwpe.size(), 15);
  std::vector<float> a_wte = p_wte, a_wpe = p_wpe;
  encoder_backward(a_wte, a_wpe, k.dout, k.tokens, k.B, k.T, k.C, k.V);
  expect_accumulates(p_wte, dwte, a_wte, "dwte");
  expect_accumulates(p_wpe, dwpe, a_wpe, "dwpe");
}

TEST(Encoder, RejectsTokensOutsideTheVocabulary) {
  EncoderCase k;
  k.tokens[7] = 11;
  try {
    encoder_forward(k.out, k.tokens, k.wte, k.wpe, k.B, k.T, k.C, k.V);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "encoder_forward: token 11 at (b=1, t=2) is outside [0, V=11)");
  }
  k.tokens[7] = -1;
  std::vector<float> dwte(k.wte.size()), dwpe(k.wpe.size());
  EXPECT_THROW(encoder_backward(dwte, dwpe, k.dout, k.tokens, k.B, k.T, k.C, k.V), InvalidArgument);
}

TEST(Encoder, RejectsAPositionTableShorterThanT) {
  EncoderCase k;
  std::vector<float> short_wpe(4 * k.C);
  EXPECT_THROW(encoder_forward(k.out, k.tokens, k.wte, short_wpe, k.B, k.T, k.C, k.V),
               InvalidArgument);
}

// ---------------------------------------------------------------- LayerNorm

struct LayerNormCase {
  size_t rows = 10, C = 12;
  // A mean away from 0 and a spread away from 1 exercise both halves of the normalization.
  std::vector<float> inp = normal_vector(rows * C, 21, 2.0f, 0.5f);
  std::vector<float> weight = normal_vector(C, 22, 0.3f, 1.0f);
  std::vector<float> bias = normal_vector(C, 23, 0.3f);
  std::vector<float> dout = normal_vector(rows * C, 24);
  std::vector<float> out = std::vector<float>(rows * C);
  std::vector<float> mean = std::vector<float>(rows);
  std::vector<float> rstd = std::vector<float>(rows);
  void forward() { layernorm_forward(out, mean, rstd, inp, weight, bias, rows, C); }
};

TEST(LayerNorm, ForwardNormalizesEachRow) {
  LayerNormCase k;
  k.forward();
  for (size_t r = 0; r < k.rows; ++r) {
    double m = 0.0, v = 0.0;
    for (size_t i = 0; i < k.C; ++i) m += k.inp[r * k.C + i];
    m /= double(k.C);
    for (size_t i = 0; i < k.C; ++i) v += std::pow(k.inp[r * k.C + i] - m, 2);
    v /= double(k.C);
    const double s = 1.0 / std::sqrt(v + 1e-5);
    EXPECT_NEAR(k.mean[r], m, 1e-6);
    EXPECT_NEAR(k.rstd[r], s, 1e-6 * s);
    for (size_t i = 0; i < k.C; ++i) {
      const double want = (k.inp[r * k.C + i] - m) * s * k.weight[i] + k.bias[i];
      EXPECT_NEAR(k.out[r * k.C + i], want, 1e-5);
    }
  }
}

// Non-linear: h = 1e-2 against inputs of spread 2 keeps the truncation term (~h^2 |f'''|
// ~ 1e-5 here) and the rounding term (~1e-7 * C / 2h ~ 1e-4 worst case) under 3e-4.
constexpr Tolerance kLayerNormTol{1e-2f, 3e-4, 1e-3};

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  LayerNormCase k;
  k.forward();
  std::vector<float> dinp(k.inp.size()), dweight(k.C), dbias(k.C);
  layernorm_backward(dinp, dweight, dbias, k.dout, k.inp, k.weight, k.mean, k.rstd, k.rows, k.C);
  auto objective = [&] {
    k.forward();
    return weighted_sum(k.out, k.dout);
  };
  expect_gradient_matches("dinp", k.inp, dinp, objective, kLayerNormTol);
  expect_gradient_matches("dweight", k.weight, dweight, objective, kLayerNormTol);
  expect_gradient_matches("dbias", k.bias, dbias, objective, kLayerNormTol);
}

TEST(LayerNorm, BackwardAccumulates) {
  LayerNormCase k;
  k.forward();
  std::vector<float> dinp(k.inp.size()), dweight(k.C), dbias(k.C);
  layernorm_backward(dinp, dweight, dbias, k.dout, k.inp, k.weight, k.mean, k.rstd, k.rows, k.C);
  const auto p_inp = normal_vector(dinp.size(), 25);
  const auto p_weight = normal_vector(k.C, 26);
  const auto p_bias = normal_vector(k.C, 27);
  std::vector<float> a_inp = p_inp, a_weight = p_weight, a_bias = p_bias;
  layernorm_backward(a_inp, a_weight, a_bias, k.dout, k.inp, k.weight, k.mean, k.rstd, k.rows, k.C);
  expect_accumulates(p_inp, dinp, a_inp, "dinp");
  // dweight and dbias sum over rows into the prefill one row at a time: each partial sum
  // is rounded, so allow a few more ulps than one add.
  for (size_t i = 0; i < k.C; ++i) {
    EXPECT_NEAR(a_weight[i], p_weight[i] + dweight[i], 1e-5f);
    EXPECT_NEAR(a_bias[i], p_bias[i] + dbias[i], 1e-5f);
  }
}

// ---------------------------------------------------------------- GELU

// The bf16 pipeline's outputs: LayerNorm and GELU written in bf16 are their fp32 outputs
// rounded as convert() rounds, bit for bit (GELU over several of its internal chunks and a
// ragged tail; LayerNorm with a row length that is not a multiple of its lanes).
TEST(Bf16Outputs, LayerNormAndGeluRoundTheirFp32Outputs) {
  const size_t rows = 7, C = 45;
  const std::vector<float> inp = normal_vector(rows * C, 21, 3.0f);
  const std::vector<float> weight = normal_vector(C, 22), bias = normal_vector(C, 23);
  std::vector<float> out(rows * C), mean(rows), rstd(rows), mean16(rows), rstd16(rows);
  std::vector<BFloat16> out16(rows * C);
  layernorm_forward(out, mean, rstd, inp, weight, bias, rows, C);
  layernorm_forward(std::span<BFloat16>(out16), mean16, rstd16, inp, weight, bias, rows, C);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out16[i].bits, to_bf16(out[i]).bits) << i;
  EXPECT_EQ(mean, mean16);
  EXPECT_EQ(rstd, rstd16);

  const std::vector<float> x = normal_vector(5000, 24, 2.0f);
  std::vector<float> g(x.size());
  std::vector<BFloat16> g16(x.size());
  gelu_forward(g, x);
  gelu_forward(std::span<BFloat16>(g16), x);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g16[i].bits, to_bf16(g[i]).bits) << i;
  EXPECT_THROW(gelu_forward(std::span<BFloat16>(g16).first(10), x), InvalidArgument);
}

// GELU's backward for a bf16 c_fc: its gradient is gelu_backward's rounded, and the bias
// gradient it sums is the one linear_backward sums from the fp32 gradient, bit for bit; a
// Linear given that bf16 gradient then takes no bias of its own.
TEST(Bf16Outputs, GeluBackwardRoundsItsGradientAndSumsTheBiasGradient) {
  const size_t rows = 9, width = 37, C = 5;
  const std::vector<float> x = normal_vector(rows * width, 31, 2.0f);
  const std::vector<float> dout = normal_vector(rows * width, 32);
  std::vector<float> g(rows * width);
  gelu_backward(g, x, dout, InputGrad::kOverwrite);
  // linear_backward's bias sum over g, from a prefilled bias gradient.
  const std::vector<float> prefill = normal_vector(width, 33);
  std::vector<float> dbias_want = prefill, dweight(width * C), dinp(rows * C);
  const std::vector<float> inp = normal_vector(rows * C, 34), weight = normal_vector(width * C, 35);
  linear_backward(dinp, dweight, dbias_want, g, inp, weight, rows, C, width, kFp32);

  std::vector<BFloat16> g16(rows * width);
  std::vector<float> dbias = prefill;
  gelu_backward_bf16(g16, dbias, x, dout, rows, width);
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g16[i].bits, to_bf16(g[i]).bits) << i;
  for (size_t o = 0; o < width; ++o) EXPECT_EQ(dbias[o], dbias_want[o]) << o;

  std::vector<float> dw16(width * C, 0.0f), dinp16(rows * C);
  EXPECT_NO_THROW(linear_backward(dinp16, dw16, {}, std::span<const BFloat16>(g16), inp, weight,
                                  rows, C, width, GemmCompute::kBF16));
  EXPECT_THROW(linear_backward(dinp16, dw16, dbias, std::span<const BFloat16>(g16), inp, weight,
                               rows, C, width, GemmCompute::kBF16),
               InvalidArgument);
  EXPECT_THROW(linear_backward(dinp16, dw16, {}, std::span<const BFloat16>(g16), inp, weight, rows,
                               C, width, kFp32),
               InvalidArgument);
}

TEST(Gelu, ForwardIsTheExactErfForm) {
  // x * Phi(x), from the standard normal CDF in double.
  const std::vector<float> x{-3.0f, -1.0f, 0.0f, 0.5f, 1.0f, 3.0f};
  std::vector<float> y(x.size());
  gelu_forward(y, x);
  const double want[] = {-0.0040496940948903, -0.15865525393145707, 0.0,
                         0.34573123063700656, 0.8413447460685429,   2.9959503059051097};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], want[i], 2e-7 * (1 + std::abs(want[i])));
}

// h = 1e-2 balances the two terms: truncation h^2/6 * max|f'''| (0.8) * |dout| (< 4) is
// <= 6e-5, rounding 6e-8 * |out| (< 8) * |dout| / 2h is <= 1e-4.
constexpr Tolerance kGeluTol{1e-2f, 2e-4, 1e-4};

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  std::vector<float> inp = normal_vector(61, 31, 2.0f);
  const std::vector<float> dout = normal_vector(61, 32);
  std::vector<float> out(61), dinp(61);
  gelu_backward(dinp, inp, dout);
  auto objective = [&] {
    gelu_forward(out, inp);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("dinp", inp, dinp, objective, kGeluTol);
}

TEST(Gelu, BackwardAccumulates) {
  const std::vector<float> inp = normal_vector(61, 33, 2.0f);
  const std::vector<float> dout = normal_vector(61, 34);
  std::vector<float> dinp(61);
  gelu_backward(dinp, inp, dout);
  const auto prefill = normal_vector(61, 35);
  std::vector<float> got = prefill;
  gelu_backward(got, inp, dout);
  expect_accumulates(prefill, dinp, got, "dinp");
}

TEST(Gelu, OverwritingTheInputGradientIgnoresWhatItHeld) {
  const std::vector<float> inp = normal_vector(61, 33, 2.0f);
  const std::vector<float> dout = normal_vector(61, 34);
  std::vector<float> dinp(61);
  gelu_backward(dinp, inp, dout);
  std::vector<float> got(61, std::nanf(""));
  gelu_backward(got, inp, dout, InputGrad::kOverwrite);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], dinp[i]) << "dinp[" << i << "]";
}

// ---------------------------------------------------------------- Residual

TEST(Residual, ForwardAddsAndBackwardMatchesFiniteDifferences) {
  std::vector<float> a = normal_vector(23, 41), b = normal_vector(23, 42);
  const std::vector<float> dout = normal_vector(23, 43);
  std::vector<float> out(23), da(23), db(23);
  residual_forward(out, a, b);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i]);
  residual_backward(da, db, dout);
  auto objective = [&] {
    residual_forward(out, a, b);
    return weighted_sum(out, dout);
  };
  expect_gradient_matches("dinp1", a, da, objective, kLinearInEachInput);
  expect_gradient_matches("dinp2", b, db, objective, kLinearInEachInput);
}

TEST(Residual, BackwardAccumulates) {
  const std::vector<float> dout = normal_vector(23, 44);
  const auto p1 = normal_vector(23, 45), p2 = normal_vector(23, 46);
  std::vector<float> a1 = p1, a2 = p2;
  residual_backward(a1, a2, dout);
  for (size_t i = 0; i < dout.size(); ++i) {
    EXPECT_EQ(a1[i], p1[i] + dout[i]);
    EXPECT_EQ(a2[i], p2[i] + dout[i]);
  }
}

// ---------------------------------------------------------------- Cross-entropy

TEST(CrossEntropy, LossAndGradientMatchAHandComputation) {
  // Row 0: logits (1, 2, 3), target 2: loss = log(1 + e^-1 + e^-2) = 0.4076059644443806.
  // Row 1: logits (0, 0, 0), target 0: loss = log 3 = 1.0986122886681098.
  // Row 2: ignored. Mean over the 2 counted rows: 0.7531091265562452.
  const std::vector<float> logits{1, 2, 3, 0, 0, 0, 5, -5, 0};
  const std::vector<int32_t> targets{2, 0, kIgnoreTarget};
  std::vector<float> dlogits(9);
  const float loss = cross_entropy_forward_backward(dlogits, logits, targets, 3, 3);
  EXPECT_NEAR(loss, 0.7531091265562452, 1e-6);
  // (softmax - onehot) / 2: softmax(1, 2, 3) = (0.0900306, 0.2447285, 0.6652410).
  const double want[] = {0.09003057317038046 / 2,
                         0.24472847105479767 / 2,
                         (0.6652409557748219 - 1) / 2,
                         -1.0 / 3,
                         1.0 / 6,
                         1.0 / 6,
                         0,
                         0,
                         0};
  for (size_t i = 0; i < 9; ++i) EXPECT_NEAR(dlogits[i], want[i], 1e-7) << i;
}

TEST(CrossEntropy, IsStableForLargeLogits) {
  const std::vector<float> logits{1000.0f, 0.0f, -1000.0f};
  const std::vector<int32_t> targets{1};
  std::vector<float> dlogits(3);
  EXPECT_NEAR(cross_entropy_forward_backward(dlogits, logits, targets, 1, 3), 1000.0, 1e-3);
  EXPECT_NEAR(dlogits[0], 1.0f, 1e-7);
  EXPECT_NEAR(dlogits[1], -1.0f, 1e-7);
}

// The returned loss is fp32 (~6e-8 * 2.5 rounding): h = 5e-2 keeps rounding / 2h near 3e-6
// and truncation h^2/6 * max|d^3 loss| (<= 0.1 / counted rows) near 5e-6.
constexpr Tolerance kCrossEntropyTol{5e-2f, 5e-5, 1e-3};

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const size_t rows = 10, V = 13;
  std::vector<float> logits = normal_vector(rows * V, 51, 2.0f);
  std::vector<int32_t> targets{0, 12, 3, kIgnoreTarget, 7, 7, 1, 11, 5, 2};
  std::vector<float> dlogits(rows * V);
  cross_entropy_forward_backward(dlogits, logits, targets, rows, V);
  auto objective = [&] {
    return double(cross_entropy_forward_backward({}, logits, targets, rows, V));
  };
  expect_gradient_matches("dlogits", logits, dlogits, objective, kCrossEntropyTol);
  for (size_t v = 0; v < V; ++v) EXPECT_EQ(dlogits[3 * V + v], 0.0f);  // the ignored row
}

TEST(CrossEntropy, ScalesByDlossAndAccumulates) {
  const size_t rows = 4, V = 5;
  const std::vector<float> logits = normal_vector(rows * V, 52);
  const std::vector<int32_t> targets{4, 0, 2, 2};
  std::vector<float> d1(rows * V);
  const float loss = cross_entropy_forward_backward(d1, logits, targets, rows, V);
  const auto prefill = normal_vector(rows * V, 53);
  std::vector<float> d2 = prefill;
  EXPECT_EQ(cross_entropy_forward_backward(d2, logits, targets, rows, V, 0.25f), loss);
  std::vector<float> scaled(rows * V);
  for (size_t i = 0; i < d1.size(); ++i) scaled[i] = 0.25f * d1[i];
  expect_accumulates(prefill, scaled, d2, "dlogits");
}

TEST(CrossEntropy, AllIgnoredGivesZeroAndNoGradient) {
  const std::vector<float> logits{1, 2, 3, 4};
  const std::vector<int32_t> targets{kIgnoreTarget, kIgnoreTarget};
  std::vector<float> dlogits(4, 7.0f);
  EXPECT_EQ(cross_entropy_forward_backward(dlogits, logits, targets, 2, 2), 0.0f);
  for (float x : dlogits) EXPECT_EQ(x, 7.0f);
}

TEST(CrossEntropy, RejectsTargetsOutsideTheVocabulary) {
  const std::vector<float> logits(6);
  EXPECT_THROW(cross_entropy_forward_backward({}, logits, std::vector<int32_t>{0, 3}, 2, 3),
               InvalidArgument);
  EXPECT_THROW(cross_entropy_forward_backward({}, logits, std::vector<int32_t>{-2, 0}, 2, 3),
               InvalidArgument);
}

}  // namespace
}  // namespace zerodp

namespace zerodp {
namespace {

// The polynomial erfc/exp behind GELU against long double erfc/exp over the whole useful
// range, relative error (the tails are where 1 + erf would lose everything).
TEST(GeluAccuracy, MatchesTheErfcReferenceWithinAFewUlpsEverywhere) {
  std::vector<float> x;
  for (float v = -14.0f; v <= 14.0f; v += 0.000731f) x.push_back(v);
  std::vector<float> y(x.size()), g(x.size(), 0.0f), ones(x.size(), 1.0f);
  gelu_forward(y, x);
  gelu_backward(g, x, ones);
  double worst_y = 0, worst_g = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const long double v = x[i];
    const long double cdf = 0.5L * erfcl(-v / sqrtl(2.0L));
    const long double ref_y = v * cdf;
    const long double ref_g = cdf + v * expl(-0.5L * v * v) / sqrtl(2.0L * 3.14159265358979323846L);
    if (fabsl(ref_y) > 1e-35L) {
      worst_y = std::max(worst_y, static_cast<double>(fabsl(y[i] - ref_y) / fabsl(ref_y)));
    }
    if (fabsl(ref_g) > 1e-35L) {
      worst_g = std::max(worst_g, static_cast<double>(fabsl(g[i] - ref_g) / fabsl(ref_g)));
    }
  }
  // The erfc fit is good to 1.2e-7, but exp(-z^2 + P) rounds its argument to fp32 first:
  // an absolute error of ulp(z^2) ~ z^2 * 6e-8 becomes that relative error of the result,
  // 1.7e-5 at x = -12 (values near 1e-34), 1e-6 at x = -4. (1 + erf(x) in fp32, as a
  // plain erf-based GELU computes it, is off by ~1e-3 relative already at x = -4.)
  EXPECT_LT(worst_y, 3e-5);
  // The derivative subtracts nearly equal terms near x = -0.75 (where it crosses 0); the
  // bound is relative to |derivative|, so allow more there.
  EXPECT_LT(worst_g, 1e-3);
}

}  // namespace
}  // namespace zerodp
