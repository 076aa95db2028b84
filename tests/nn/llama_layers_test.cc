// The Llama family's layers: the embedding, RMSNorm, rotary embedding (rotate-half), SwiGLU and
// the rotary grouped-query pack, forward against the formulas in double (or, for the fused
// layers, bit for bit against the composition of the plain ones), backward against central
// finite differences, the "backward adds" convention, the pinned rotary table, bf16 outputs
// as convert() rounds the fp32 ones, and shape checks. Tolerances as in
// layers_test.cc: the step's truncation error for non-linear layers, rounding for linear ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/grad_check.h"
#include "nn/layers.h"
#include "tensor/dtype.h"

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

// Bit-for-bit equality of two float vectors, naming the first difference.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
}

// `values` rounded to bf16 as convert() rounds them.
std::vector<BFloat16> rounded(const std::vector<float>& values) {
  std::vector<BFloat16> out(values.size());
  convert(std::span<const float>(values), std::span<BFloat16>(out));
  return out;
}

// ---------------------------------------------------------------- Embedding

TEST(Embedding, ForwardCopiesTokenRowsAndBackwardAddsThemInOrder) {
  const size_t B = 2, T = 3, C = 4, V = 5;
  const std::vector<float> wte = normal_vector(V * C, 21);
  const std::vector<int32_t> tokens = {4, 0, 4, 2, 2, 1};
  std::vector<float> out(B * T * C);
  embedding_forward(out, tokens, wte, B, T, C, V);
  for (size_t r = 0; r < B * T; ++r) {
    for (size_t i = 0; i < C; ++i) EXPECT_EQ(out[r * C + i], wte[tokens[r] * C + i]) << r;
  }
  const std::vector<float> dout = normal_vector(B * T * C, 22);
  std::vector<float> dwte(V * C, 0.5f);
  embedding_backward(dwte, dout, tokens, B, T, C, V);
  for (size_t v = 0; v < V; ++v) {
    for (size_t i = 0; i < C; ++i) {
      float want = 0.5f;
      for (size_t r = 0; r < B * T; ++r)
        want += tokens[r] == static_cast<int32_t>(v) ? dout[r * C + i] : 0.0f;
      EXPECT_EQ(dwte[v * C + i], want) << v << "," << i;
    }
  }
}

TEST(Embedding, ATokenOutsideTheVocabularyIsNamedWithItsPosition) {
  const std::vector<float> wte(5 * 2);
  const std::vector<int32_t> tokens = {1, 2, 5, 0};
  std::vector<float> out(4 * 2);
  try {
    embedding_forward(out, tokens, wte, 2, 2, 2, 5);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token 5 at (b=1, t=0) is outside [0, V=5)"),
              std::string::npos)
        << e.what();
  }
  const std::vector<int32_t> negative = {1, -1, 0, 0};
  std::vector<float> dwte(wte.size());
  EXPECT_THROW(embedding_backward(dwte, out, negative, 2, 2, 2, 5), InvalidArgument);
}

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

// A bf16 output is the fp32 output rounded, bit for bit; the saved 1/rms is the same.
TEST(RmsNorm, Bf16OutputIsTheFp32OutputRounded) {
  RmsCase k;
  k.forward();
  std::vector<BFloat16> out16(k.out.size());
  std::vector<float> rstd16(k.rows);
  rmsnorm_forward(std::span<BFloat16>(out16), rstd16, k.inp, k.weight, k.rows, k.C, k.eps);
  EXPECT_EQ(out16, rounded(k.out));
  expect_same_bits(rstd16, k.rstd, "rstd");
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
  // Far tails: silu(g) -> g for large g, -> 0 (from below, never NaN) for very negative g.
  const std::vector<float> tail_gate{-1000.0f, -90.0f, -30.0f, 30.0f, 90.0f, 1000.0f};
  const std::vector<float> ones(tail_gate.size(), 1.0f);
  std::vector<float> tail(tail_gate.size());
  swiglu_forward(tail, tail_gate, ones);
  for (size_t i = 0; i < tail.size(); ++i) {
    const double g = tail_gate[i];
    const double want = g / (1.0 + std::exp(-g));
    EXPECT_NEAR(tail[i], want, 1e-6 * std::abs(want) + 1e-30) << g;
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

// ---------------------------------------------------------------- SwiGLU over rows

// gate and up side by side in each row: each row's values are swiglu_forward's and
// swiglu_backward's on that row's two halves, bit for bit.
TEST(SwiGluRows, IsTheFlatLayerOnEachRowsHalves) {
  const size_t rows = 4, F = 7;
  const std::vector<float> gate_up = normal_vector(rows * 2 * F, 56, 2.0f);
  const std::vector<float> dout = normal_vector(rows * F, 57);
  std::vector<float> out(rows * F), dgate_up(rows * 2 * F, 0.25f);
  swiglu_rows_forward(out, gate_up, rows, F);
  swiglu_rows_backward(dgate_up, dout, gate_up, rows, F);
  std::vector<float> want(rows * F), want_d(rows * 2 * F, 0.25f);
  for (size_t r = 0; r < rows; ++r) {
    const std::span<const float> g(gate_up.data() + r * 2 * F, F), u(g.data() + F, F);
    swiglu_forward(std::span<float>(want).subspan(r * F, F), g, u);
    swiglu_backward(std::span<float>(want_d).subspan(r * 2 * F, F),
                    std::span<float>(want_d).subspan(r * 2 * F + F, F),
                    std::span<const float>(dout).subspan(r * F, F), g, u);
  }
  expect_same_bits(out, want, "out");
  expect_same_bits(dgate_up, want_d, "dgate_up");
  // Written instead of added: the sum into zeros, whatever the buffer held.
  std::vector<float> written(rows * 2 * F, 7.0f), added(rows * 2 * F, 0.0f);
  swiglu_rows_backward(written, dout, gate_up, rows, F, InputGrad::kOverwrite);
  swiglu_rows_backward(added, dout, gate_up, rows, F);
  expect_same_bits(written, added, "dgate_up written");
  std::vector<BFloat16> out16(rows * F);
  swiglu_rows_forward(std::span<BFloat16>(out16), gate_up, rows, F);
  EXPECT_EQ(out16, rounded(out));
  std::vector<float> short_out(rows * F - 1);
  EXPECT_THROW(swiglu_rows_forward(short_out, gate_up, rows, F), InvalidArgument);
}

// ---------------------------------------------------------------- Rotary grouped-query pack

// proj (rows, (heads + 2 kv) HS) from one product; the pack against rope_forward/backward and
// repeat_kv_forward/backward composed on dense copies of its parts.
struct RopeQkvCase {
  size_t B = 2, T = 5, heads = 6, kv = 2, HS = 4;
  RopeTable table = rope_table(7, 4, 10000.0f);
  size_t rows() const { return B * T; }
  size_t C() const { return heads * HS; }
  size_t KV() const { return kv * HS; }
  size_t P() const { return C() + 2 * KV(); }
  std::vector<float> proj = normal_vector(rows() * P(), 81);
  std::vector<float> dqkv = normal_vector(rows() * 3 * C(), 82);

  // Columns [from, from + width) of every row of `m` (row stride `stride`), densely.
  static std::vector<float> columns(const std::vector<float>& m, size_t rows, size_t stride,
                                    size_t from, size_t width) {
    std::vector<float> out(rows * width);
    for (size_t r = 0; r < rows; ++r) {
      std::copy_n(m.begin() + static_cast<std::ptrdiff_t>(r * stride + from), width,
                  out.begin() + static_cast<std::ptrdiff_t>(r * width));
    }
    return out;
  }
  static void put_columns(std::vector<float>& m, const std::vector<float>& part, size_t rows,
                          size_t stride, size_t from, size_t width) {
    for (size_t r = 0; r < rows; ++r) {
      std::copy_n(part.begin() + static_cast<std::ptrdiff_t>(r * width), width,
                  m.begin() + static_cast<std::ptrdiff_t>(r * stride + from));
    }
  }

  std::vector<float> forward() const {
    std::vector<float> qkv(rows() * 3 * C());
    rope_qkv_forward(qkv, proj, table, B, T, heads, kv, HS);
    return qkv;
  }
  std::vector<float> composed_forward() const {
    const auto q = columns(proj, rows(), P(), 0, C());
    const auto k = columns(proj, rows(), P(), C(), KV());
    const auto v = columns(proj, rows(), P(), C() + KV(), KV());
    std::vector<float> q_rot(q.size()), k_rot(k.size()), k_wide(rows() * C()), v_wide(rows() * C());
    rope_forward(q_rot, q, table, B, T, heads, HS);
    rope_forward(k_rot, k, table, B, T, kv, HS);
    repeat_kv_forward(k_wide, k_rot, rows(), heads, kv, HS);
    repeat_kv_forward(v_wide, v, rows(), heads, kv, HS);
    std::vector<float> qkv(rows() * 3 * C());
    put_columns(qkv, q_rot, rows(), 3 * C(), 0, C());
    put_columns(qkv, k_wide, rows(), 3 * C(), C(), C());
    put_columns(qkv, v_wide, rows(), 3 * C(), 2 * C(), C());
    return qkv;
  }
  // Both add into dproj, which starts at `start`.
  std::vector<float> backward(const std::vector<float>& start) const {
    std::vector<float> dproj = start;
    rope_qkv_backward(dproj, dqkv, table, B, T, heads, kv, HS);
    return dproj;
  }
  std::vector<float> composed_backward(const std::vector<float>& start) const {
    auto dq = columns(start, rows(), P(), 0, C());
    auto dk = columns(start, rows(), P(), C(), KV());
    auto dv = columns(start, rows(), P(), C() + KV(), KV());
    std::vector<float> dk_sum(dk.size(), 0.0f);
    repeat_kv_backward(dk_sum, columns(dqkv, rows(), 3 * C(), C(), C()), rows(), heads, kv, HS);
    rope_backward(dk, dk_sum, table, B, T, kv, HS);
    repeat_kv_backward(dv, columns(dqkv, rows(), 3 * C(), 2 * C(), C()), rows(), heads, kv, HS);
    rope_backward(dq, columns(dqkv, rows(), 3 * C(), 0, C()), table, B, T, heads, HS);
    std::vector<float> dproj(start.size());
    put_columns(dproj, dq, rows(), P(), 0, C());
    put_columns(dproj, dk, rows(), P(), C(), KV());
    put_columns(dproj, dv, rows(), P(), C() + KV(), KV());
    return dproj;
  }
};

// Groups of 3 (6 heads over 2), no sharing (kv == heads), one kv head for all (kv == 1).
TEST(RopeQkv, IsRopeThenRepeatKvBitForBit) {
  for (const size_t kv : {2u, 6u, 1u}) {
    SCOPED_TRACE(kv);
    RopeQkvCase k;
    k.kv = kv;
    k.proj = normal_vector(k.rows() * k.P(), 83);
    expect_same_bits(k.forward(), k.composed_forward(), "qkv");
    const std::vector<float> start = normal_vector(k.rows() * k.P(), 84);
    expect_same_bits(k.backward(start), k.composed_backward(start), "dproj");
    std::vector<BFloat16> qkv16(k.rows() * 3 * k.C());
    rope_qkv_forward(std::span<BFloat16>(qkv16), k.proj, k.table, k.B, k.T, k.heads, k.kv, k.HS);
    EXPECT_EQ(qkv16, rounded(k.forward()));
  }
}

TEST(RopeQkv, BackwardMatchesFiniteDifferences) {
  RopeQkvCase k;
  std::vector<float> dproj(k.rows() * k.P());
  rope_qkv_backward(dproj, k.dqkv, k.table, k.B, k.T, k.heads, k.kv, k.HS);
  std::vector<float> qkv(k.rows() * 3 * k.C());
  auto objective = [&] {
    rope_qkv_forward(qkv, k.proj, k.table, k.B, k.T, k.heads, k.kv, k.HS);
    return weighted_sum(qkv, k.dqkv);
  };
  expect_gradient_matches("dproj", k.proj, dproj, objective, kLinear);
}

TEST(RopeQkv, RefusesAnUnevenGroupATableTooShortAndWrongLengths) {
  RopeQkvCase k;
  std::vector<float> qkv(k.rows() * 3 * k.C());
  EXPECT_THROW(rope_qkv_forward(qkv, k.proj, k.table, k.B, k.T, k.heads, 4, k.HS), InvalidArgument);
  const RopeTable short_table = rope_table(4, 4, 10000.0f);
  EXPECT_THROW(rope_qkv_forward(qkv, k.proj, short_table, k.B, k.T, k.heads, k.kv, k.HS),
               InvalidArgument);
  std::vector<float> short_qkv(qkv.size() - 1);
  EXPECT_THROW(rope_qkv_forward(short_qkv, k.proj, k.table, k.B, k.T, k.heads, k.kv, k.HS),
               InvalidArgument);
  std::vector<float> dproj(k.proj.size() + 1);
  EXPECT_THROW(rope_qkv_backward(dproj, k.dqkv, k.table, k.B, k.T, k.heads, k.kv, k.HS),
               InvalidArgument);
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

// Under kBF16 the input may come in bf16 (a norm's output kept as the products read it): the
// loss and gradients are those of the same values given in fp32, bit for bit.
TEST(HeadCrossEntropy, ABf16InputIsItsValuesInFp32) {
  HeadCase k;
  const std::vector<BFloat16> inp16 = rounded(k.inp);
  std::vector<float> inp_rounded(k.inp.size());
  convert(std::span<const BFloat16>(inp16), std::span<float>(inp_rounded));
  std::vector<float> dinp(k.rows * k.C), dweight(k.V * k.C);
  std::vector<float> want_dinp(dinp.size()), want_dweight(dweight.size());
  const float loss = head_cross_entropy(dinp, dweight, k.scratch, std::span<const BFloat16>(inp16),
                                        k.weight, k.targets, k.rows, k.C, k.V, GemmCompute::kBF16);
  const float want = head_cross_entropy(want_dinp, want_dweight, k.scratch, inp_rounded, k.weight,
                                        k.targets, k.rows, k.C, k.V, GemmCompute::kBF16);
  EXPECT_EQ(loss, want);
  expect_same_bits(dinp, want_dinp, "dinp");
  expect_same_bits(dweight, want_dweight, "dweight");
}

}  // namespace
}  // namespace zerodp
