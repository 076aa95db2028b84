// GELU, exact erf form: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
//
// Cost: glibc's scalar erff and expf per element, not vectorized: on the GPT-small MLP
// activation (1024 x 512) ~5 ms forward and ~8 ms backward on this machine, 7-10x the fc
// product that feeds it (~0.7 ms). TODO(GELU performance issue): a branch-free polynomial
// erf the compiler vectorizes, with identical bits in vector and scalar lanes.
#include "nn/layers.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "nn/check.h"

namespace zerodp {

using nn_detail::check_count;

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi)
}  // namespace

void gelu_forward(std::span<float> out, std::span<const float> inp) {
  check_count("gelu_forward", "inp", inp, out.size(), fmt::format("(count={})", out.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
  }
}

void gelu_backward(std::span<float> dinp, std::span<const float> inp, std::span<const float> dout) {
  const std::string shape = fmt::format("(count={})", dinp.size());
  check_count("gelu_backward", "inp", inp, dinp.size(), shape);
  check_count("gelu_backward", "dout", dout, dinp.size(), shape);
  // d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density.
  for (size_t i = 0; i < dinp.size(); ++i) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
    dinp[i] += (cdf + x * pdf) * dout[i];
  }
}

}  // namespace zerodp
