// GELU, exact erf form: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), and its
// derivative Phi(x) + x phi(x).
//
// Phi is computed as 0.5 erfc(-x / sqrt 2) directly (never 1 + erf, which loses the
// relative accuracy of tiny values for negative x), with erfc from the Chebyshev-fitted
// form in Numerical Recipes (erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), fractional
// error < 1.2e-7 for z >= 0) and exp by range reduction plus a degree-7 polynomial; the
// fp32 rounding of exp's argument -z^2 + P makes the relative error grow in the far tail
// (1e-6 at x = -4, 2e-5 at x = -12, where values are ~1e-34; tested). Every
// operation is fp32 arithmetic or an exactly rounded fused multiply-add, without branches,
// so the loops vectorize, the bits are the same in vector and scalar lanes and in every
// clone (nn/vecmath.h), and nothing depends on the libm at hand.
// Measured: ~13x faster than glibc's scalar erff/expf on GPT-small's 1024 x 512 activation
// (bench_layers: 0.76 ms per million elements forward, 1.04 backward).
#include "nn/layers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "nn/check.h"
#include "nn/vecmath.h"
#include "tensor/dtype.h"

namespace zerodp {

using nn_detail::check_count;
using nn_detail::check_size;
using nn_detail::exp_nonpositive;

namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi)

// erfc(z) for z >= 0.
inline float erfc_nonnegative(float z) {
  const float t = 1.0f / std::fma(0.5f, z, 1.0f);
  float p = 0.17087277f;
  p = std::fma(p, t, -0.82215223f);
  p = std::fma(p, t, 1.48851587f);
  p = std::fma(p, t, -1.13520398f);
  p = std::fma(p, t, 0.27886807f);
  p = std::fma(p, t, -0.18628806f);
  p = std::fma(p, t, 0.09678418f);
  p = std::fma(p, t, 0.37409196f);
  p = std::fma(p, t, 1.00002368f);
  p = std::fma(p, t, -1.26551223f);
  return t * exp_nonpositive(std::fma(-z, z, p));
}

// Phi(x), the standard normal CDF.
inline float normal_cdf(float x) {
  const float z = (x < 0.0f ? -x : x) * kInvSqrt2;
  const float half_tail = 0.5f * erfc_nonnegative(z);  // P(X > |x|)
  return x < 0.0f ? half_tail : 1.0f - half_tail;
}

ZERODP_NN_CLONES void gelu_forward_loop(float* __restrict o, const float* __restrict in, size_t n) {
  for (size_t i = 0; i < n; ++i) o[i] = in[i] * normal_cdf(in[i]);
}

inline float gelu_derivative(float x) {
  const float pdf = kInvSqrt2Pi * exp_nonpositive(-0.5f * x * x);
  return std::fma(x, pdf, normal_cdf(x));
}

ZERODP_NN_CLONES void gelu_backward_add(float* __restrict g, const float* __restrict in,
                                        const float* __restrict d, size_t n) {
  for (size_t i = 0; i < n; ++i) g[i] = std::fma(gelu_derivative(in[i]), d[i], g[i]);
}

ZERODP_NN_CLONES void gelu_backward_write(float* __restrict g, const float* __restrict in,
                                          const float* __restrict d, size_t n) {
  for (size_t i = 0; i < n; ++i) g[i] = gelu_derivative(in[i]) * d[i];
}

}  // namespace

void gelu_forward(GemmResult out, std::span<const float> inp) {
  check_size("gelu_forward", "inp", inp.size(), out.size(), fmt::format("(count={})", out.size()));
  if (!out.is_bf16()) {
    gelu_forward_loop(out.f32().data(), inp.data(), out.size());
    return;
  }
  // Through an L1-sized fp32 chunk, rounded as convert() rounds: no fp32 copy in memory.
  constexpr size_t kChunk = 2048;
  float chunk[kChunk];
  for (size_t i = 0; i < out.size(); i += kChunk) {
    const size_t n = std::min(kChunk, out.size() - i);
    gelu_forward_loop(chunk, inp.data() + i, n);
    convert(std::span<const float>(chunk, n), out.bf16().subspan(i, n));
  }
}

void gelu_backward(std::span<float> dinp, std::span<const float> inp, std::span<const float> dout,
                   InputGrad dinp_mode) {
  const std::string shape = fmt::format("(count={})", dinp.size());
  check_count("gelu_backward", "inp", inp, dinp.size(), shape);
  check_count("gelu_backward", "dout", dout, dinp.size(), shape);
  if (dinp_mode == InputGrad::kAdd) {
    gelu_backward_add(dinp.data(), inp.data(), dout.data(), dinp.size());
  } else {
    gelu_backward_write(dinp.data(), inp.data(), dout.data(), dinp.size());
  }
}

void gelu_backward_bf16(std::span<BFloat16> dinp, std::span<float> dbias,
                        std::span<const float> inp, std::span<const float> dout, size_t rows,
                        size_t width) {
  const std::string shape = fmt::format("(rows={}, width={})", rows, width);
  check_count("gelu_backward_bf16", "dinp", dinp, rows * width, shape);
  check_count("gelu_backward_bf16", "dbias", dbias, width, shape);
  check_count("gelu_backward_bf16", "inp", inp, rows * width, shape);
  check_count("gelu_backward_bf16", "dout", dout, rows * width, shape);
  // A row at a time through fp32 kept in L1: the same kernel as gelu_backward, the same
  // row-order bias sum as linear_backward's, the same rounding as convert().
  thread_local std::vector<float> row;
  row.resize(width);
  for (size_t r = 0; r < rows; ++r) {
    gelu_backward_write(row.data(), inp.data() + r * width, dout.data() + r * width, width);
    for (size_t o = 0; o < width; ++o) dbias[o] += row[o];
    convert(std::span<const float>(row), dinp.subspan(r * width, width));
  }
}

}  // namespace zerodp
