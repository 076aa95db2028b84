// Causal self-attention, one (batch, head) pair at a time, products through gemm.
//
// Forward materializes the (T, T) scores of each head in the saved buffer and turns them
// into probabilities in place; backward needs one (T, T) workspace for d(probabilities),
// turned into d(scores) in place. Cost: the full T x T products are computed and the upper
// triangle discarded (2x the causal work), and the saved state is B * NH * T * T floats.
// TODO(#8, fused attention): keep per-row log-sum-exps instead and recompute tiles.
#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "nn/check.h"
#include "tensor/gemm.h"

namespace zerodp {

using nn_detail::check_count;

namespace {

void check_dims(std::string_view fn, const AttentionDims& d) {
  if (d.NH == 0 || d.C % d.NH != 0) {
    throw InvalidArgument(fmt::format(
        "{}: C={} channels do not split into NH={} heads; use NH >= 1 dividing C", fn, d.C, d.NH));
  }
}

std::string shape_of(const AttentionDims& d) {
  return fmt::format("(B={}, T={}, C={}, NH={})", d.B, d.T, d.C, d.NH);
}

// Offsets of head h of batch b inside (B, T, 3*C) and (B, T, C) buffers.
size_t qkv_offset(const AttentionDims& d, size_t b, size_t h) {
  return b * d.T * 3 * d.C + h * d.head_size();
}
size_t out_offset(const AttentionDims& d, size_t b, size_t h) {
  return b * d.T * d.C + h * d.head_size();
}

}  // namespace

size_t attention_saved_count(const AttentionDims& d) { return d.B * d.NH * d.T * d.T; }
size_t attention_scratch_count(const AttentionDims& d) { return d.T * d.T; }

void attention_forward(std::span<float> out, std::span<float> saved, std::span<const float> qkv,
                       const AttentionDims& d) {
  check_dims("attention_forward", d);
  const std::string shape = shape_of(d);
  check_count("attention_forward", "out", out, d.B * d.T * d.C, shape);
  check_count("attention_forward", "saved", saved, attention_saved_count(d), shape);
  check_count("attention_forward", "qkv", qkv, d.B * d.T * 3 * d.C, shape);
  if (d.B == 0 || d.T == 0) return;  // (and no subspan below may start past an empty end)
  const size_t T = d.T;
  const size_t C = d.C;
  const size_t hs = d.head_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (size_t b = 0; b < d.B; ++b) {
    for (size_t h = 0; h < d.NH; ++h) {
      const auto q = qkv.subspan(qkv_offset(d, b, h));                // (T, hs), row stride 3C
      const auto k = q.subspan(C);                                    // (T, hs), row stride 3C
      const auto v = q.subspan(2 * C);                                // (T, hs), row stride 3C
      const auto att = saved.subspan((b * d.NH + h) * T * T, T * T);  // (T, T)
      // scores (T, T) = scale * q @ k^T
      gemm(Transpose::kNo, Transpose::kYes, T, T, hs, scale, q, 3 * C, k, 3 * C, 0.0f, att, T);
      // Row t: softmax over keys 0..t; keys after t get probability exactly 0.
      for (size_t t = 0; t < T; ++t) {
        float* row = att.data() + t * T;
        const float row_max = *std::max_element(row, row + t + 1);
        float sum = 0.0f;
        for (size_t u = 0; u <= t; ++u) {
          row[u] = std::exp(row[u] - row_max);
          sum += row[u];
        }
        const float inv_sum = 1.0f / sum;
        for (size_t u = 0; u <= t; ++u) row[u] *= inv_sum;
        std::fill(row + t + 1, row + T, 0.0f);
      }
      // out (T, hs), row stride C = att (T, T) @ v
      gemm(Transpose::kNo, Transpose::kNo, T, hs, T, 1.0f, att, T, v, 3 * C, 0.0f,
           out.subspan(out_offset(d, b, h)), C);
    }
  }
}

void attention_backward(std::span<float> dqkv, std::span<float> scratch,
                        std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> saved, const AttentionDims& d) {
  check_dims("attention_backward", d);
  const std::string shape = shape_of(d);
  check_count("attention_backward", "dqkv", dqkv, d.B * d.T * 3 * d.C, shape);
  check_count("attention_backward", "scratch", scratch, attention_scratch_count(d), shape);
  check_count("attention_backward", "dout", dout, d.B * d.T * d.C, shape);
  check_count("attention_backward", "qkv", qkv, d.B * d.T * 3 * d.C, shape);
  check_count("attention_backward", "saved", saved, attention_saved_count(d), shape);
  if (d.B == 0 || d.T == 0) return;
  const size_t T = d.T;
  const size_t C = d.C;
  const size_t hs = d.head_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (size_t b = 0; b < d.B; ++b) {
    for (size_t h = 0; h < d.NH; ++h) {
      const auto q = qkv.subspan(qkv_offset(d, b, h));  // (T, hs), row stride 3C
      const auto k = q.subspan(C);
      const auto v = q.subspan(2 * C);
      const auto dq = dqkv.subspan(qkv_offset(d, b, h));  // (T, hs) +=, row stride 3C
      const auto dk = dq.subspan(C);
      const auto dv = dq.subspan(2 * C);
      const auto dout_bh = dout.subspan(out_offset(d, b, h));         // (T, hs), row stride C
      const auto att = saved.subspan((b * d.NH + h) * T * T, T * T);  // (T, T)
      const auto datt = scratch.first(T * T);                         // (T, T)
      // datt (T, T) = dout (T, hs) @ v^T
      gemm(Transpose::kNo, Transpose::kYes, T, T, hs, 1.0f, dout_bh, C, v, 3 * C, 0.0f, datt, T);
      // dv (T, hs) += att^T (T, T) @ dout (T, hs)
      gemm(Transpose::kYes, Transpose::kNo, T, hs, T, 1.0f, att, T, dout_bh, C, 1.0f, dv, 3 * C);
      // Softmax backward in place: dscore_u = p_u (dp_u - sum_w p_w dp_w) over keys u <= t;
      // 0 for later keys, whose probabilities were constant 0.
      for (size_t t = 0; t < T; ++t) {
        const float* p = att.data() + t * T;
        float* g = datt.data() + t * T;
        float dot = 0.0f;
        for (size_t u = 0; u <= t; ++u) dot += p[u] * g[u];
        for (size_t u = 0; u <= t; ++u) g[u] = p[u] * (g[u] - dot);
        std::fill(g + t + 1, g + T, 0.0f);
      }
      // scores = scale * q @ k^T, so dq += scale * dscores @ k and dk += scale * dscores^T @ q
      gemm(Transpose::kNo, Transpose::kNo, T, hs, T, scale, datt, T, k, 3 * C, 1.0f, dq, 3 * C);
      gemm(Transpose::kYes, Transpose::kNo, T, hs, T, scale, datt, T, q, 3 * C, 1.0f, dk, 3 * C);
    }
  }
}

}  // namespace zerodp
