// LayerNorm over the last dimension, with the mean and 1/std saved for backward.
//
// Row sums run in kLanes independent partial sums (element i goes to lane i % kLanes),
// combined in a fixed order, then the tail: the compiler may keep the lanes in vector
// registers without reassociating anything, so every target_clones clone and every ISA gives
// the same bits, and a row's result depends only on that row. A single running sum (the
// obvious loop) cannot vectorize under strict IEEE semantics and took ~6 % of a GPT-small step.
#include "nn/layers.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "nn/check.h"
#include "nn/vecmath.h"
#include "tensor/dtype.h"

namespace zerodp {

using nn_detail::check_count;
using nn_detail::combine;
using nn_detail::kLanes;
using nn_detail::Lanes;
using nn_detail::load_lanes;

namespace {

// Sum of x, and of (x - m)^2 once m is known: the two passes of the forward statistics.
ZERODP_NN_CLONES float row_sum(const float* x, size_t C) {
  Lanes lane = {};
  size_t i = 0;
  for (; i + kLanes <= C; i += kLanes) lane += load_lanes(x + i);
  float sum = combine(lane);
  for (; i < C; ++i) sum += x[i];
  return sum;
}

ZERODP_NN_CLONES float row_sq_dev(const float* x, float m, size_t C) {
  Lanes lane = {};
  size_t i = 0;
  for (; i + kLanes <= C; i += kLanes) {
    const Lanes dev = load_lanes(x + i) - m;
    lane += dev * dev;
  }
  float sum = combine(lane);
  for (; i < C; ++i) {
    const float dev = x[i] - m;
    sum += dev * dev;
  }
  return sum;
}

ZERODP_NN_CLONES void row_normalize(float* __restrict y, const float* __restrict x, float m,
                                    float s, const float* __restrict weight,
                                    const float* __restrict bias, size_t C) {
  for (size_t i = 0; i < C; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
}

// Backward of one row: sums of g = weight * dy and of g * n, n = (x - m) s; then dx, dweight,
// dbias accumulate.
ZERODP_NN_CLONES void row_backward(float* __restrict dx, float* __restrict dweight,
                                   float* __restrict dbias, const float* __restrict dy,
                                   const float* __restrict x, const float* __restrict weight,
                                   float m, float s, float inv_c, size_t C) {
  Lanes g_lane = {};
  Lanes gn_lane = {};
  size_t i = 0;
  for (; i + kLanes <= C; i += kLanes) {
    const Lanes n = (load_lanes(x + i) - m) * s;
    const Lanes g = load_lanes(weight + i) * load_lanes(dy + i);
    g_lane += g;
    gn_lane += g * n;
  }
  float g_mean = combine(g_lane);
  float gn_mean = combine(gn_lane);
  for (; i < C; ++i) {
    const float n = (x[i] - m) * s;
    const float g = weight[i] * dy[i];
    g_mean += g;
    gn_mean += g * n;
  }
  g_mean *= inv_c;
  gn_mean *= inv_c;
  for (i = 0; i < C; ++i) {
    const float n = (x[i] - m) * s;
    const float g = weight[i] * dy[i];
    dbias[i] += dy[i];
    dweight[i] += n * dy[i];
    dx[i] += (g - g_mean - n * gn_mean) * s;
  }
}

}  // namespace

namespace {

// A row normalized into fp32, then (for bf16) rounded from a row kept in L1: the same
// rounding as convert() anywhere else, and no fp32 copy of the output in memory.
template <typename Out>
void layernorm_forward_rows(std::span<Out> out, std::span<float> mean, std::span<float> rstd,
                            std::span<const float> inp, std::span<const float> weight,
                            std::span<const float> bias, size_t rows, size_t C) {
  const std::string shape = fmt::format("(rows={}, C={})", rows, C);
  check_count("layernorm_forward", "out", out, rows * C, shape);
  check_count("layernorm_forward", "mean", mean, rows, shape);
  check_count("layernorm_forward", "rstd", rstd, rows, shape);
  check_count("layernorm_forward", "inp", inp, rows * C, shape);
  check_count("layernorm_forward", "weight", weight, C, shape);
  check_count("layernorm_forward", "bias", bias, C, shape);
  if (C == 0) return;
  thread_local std::vector<float> row32;
  if constexpr (!std::is_same_v<Out, float>) row32.resize(C);
  const float inv_c = 1.0f / static_cast<float>(C);
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp.data() + r * C;
    // Two passes (mean, then the mean of squared deviations): no cancellation when the
    // mean is large against the spread, unlike E[x^2] - E[x]^2.
    const float m = row_sum(x, C) * inv_c;
    const float v = row_sq_dev(x, m, C) * inv_c;  // biased variance, as PyTorch's LayerNorm
    const float s = 1.0f / std::sqrt(v + kLayerNormEps);
    if constexpr (std::is_same_v<Out, float>) {
      row_normalize(out.data() + r * C, x, m, s, weight.data(), bias.data(), C);
    } else {
      row_normalize(row32.data(), x, m, s, weight.data(), bias.data(), C);
      convert(std::span<const float>(row32), out.subspan(r * C, C));
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

}  // namespace

void layernorm_forward(GemmResult out, std::span<float> mean, std::span<float> rstd,
                       std::span<const float> inp, std::span<const float> weight,
                       std::span<const float> bias, size_t rows, size_t C) {
  if (out.is_bf16()) {
    layernorm_forward_rows(out.bf16(), mean, rstd, inp, weight, bias, rows, C);
  } else {
    layernorm_forward_rows(out.f32(), mean, rstd, inp, weight, bias, rows, C);
  }
}

void layernorm_backward(std::span<float> dinp, std::span<float> dweight, std::span<float> dbias,
                        std::span<const float> dout, std::span<const float> inp,
                        std::span<const float> weight, std::span<const float> mean,
                        std::span<const float> rstd, size_t rows, size_t C) {
  const std::string shape = fmt::format("(rows={}, C={})", rows, C);
  check_count("layernorm_backward", "dinp", dinp, rows * C, shape);
  check_count("layernorm_backward", "dweight", dweight, C, shape);
  check_count("layernorm_backward", "dbias", dbias, C, shape);
  check_count("layernorm_backward", "dout", dout, rows * C, shape);
  check_count("layernorm_backward", "inp", inp, rows * C, shape);
  check_count("layernorm_backward", "weight", weight, C, shape);
  check_count("layernorm_backward", "mean", mean, rows, shape);
  check_count("layernorm_backward", "rstd", rstd, rows, shape);
  if (C == 0) return;
  const float inv_c = 1.0f / static_cast<float>(C);
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp.data() + r * C;
    row_backward(dinp.data() + r * C, dweight.data(), dbias.data(), dout.data() + r * C, x,
                 weight.data(), mean[r], rstd[r], inv_c, C);
  }
}

}  // namespace zerodp
