// LayerNorm over the last dimension, with the mean and 1/std saved for backward.
#include "nn/layers.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "nn/check.h"

namespace zerodp {

using nn_detail::check_count;

void layernorm_forward(std::span<float> out, std::span<float> mean, std::span<float> rstd,
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
  const float inv_c = 1.0f / static_cast<float>(C);
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp.data() + r * C;
    // Two passes (mean, then the mean of squared deviations): no cancellation when the
    // mean is large against the spread, unlike E[x^2] - E[x]^2.
    float m = 0.0f;
    for (size_t i = 0; i < C; ++i) m += x[i];
    m *= inv_c;
    float v = 0.0f;
    for (size_t i = 0; i < C; ++i) {
      const float dev = x[i] - m;
      v += dev * dev;
    }
    v *= inv_c;  // biased variance, as PyTorch's LayerNorm
    const float s = 1.0f / std::sqrt(v + kLayerNormEps);
    float* y = out.data() + r * C;
    for (size_t i = 0; i < C; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
    mean[r] = m;
    rstd[r] = s;
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
    const float* dy = dout.data() + r * C;
    float* dx = dinp.data() + r * C;
    const float m = mean[r];
    const float s = rstd[r];
    // With n = (x - m) s and g = weight * dy, dx = s (g - mean(g) - n mean(g n)).
    float g_mean = 0.0f;
    float gn_mean = 0.0f;
    for (size_t i = 0; i < C; ++i) {
      const float n = (x[i] - m) * s;
      const float g = weight[i] * dy[i];
      g_mean += g;
      gn_mean += g * n;
    }
    g_mean *= inv_c;
    gn_mean *= inv_c;
    for (size_t i = 0; i < C; ++i) {
      const float n = (x[i] - m) * s;
      const float g = weight[i] * dy[i];
      dbias[i] += dy[i];
      dweight[i] += n * dy[i];
      dx[i] += (g - g_mean - n * gn_mean) * s;
    }
  }
}

}  // namespace zerodp
