// Causal self-attention, one (batch, head) pair at a time, in blocks of query rows.
//
// A block of up to kQueryBlock query rows sees keys 0..(its last row): its scores are one
// (rows, keys) tile in scratch, never the whole (T, T) matrix, and the keys after the
// block's last row are never multiplied (about half the products at large T). Forward keeps
// each row's max score and 1 / sum of exponentials; backward recomputes the tile's scores
// with the same product and shape and so gets the same probabilities, bit for bit. All
// products go through gemm; dK and dV accumulate over the query blocks in their fixed order.
#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "nn/check.h"
#include "nn/vecmath.h"
#include "tensor/gemm.h"

namespace zerodp {

using nn_detail::check_count;
using nn_detail::combine;
using nn_detail::kLanes;
using nn_detail::Lanes;
using nn_detail::load_lanes;
using nn_detail::max_of;
using nn_detail::sum_exp_shifted;

namespace {

// Rows of a query block: large enough that the tile products run near the GEMM's rate, small
// enough that the causal saving shows at T = 128 (keys 64 + 128 of 2 x 128).
constexpr size_t kQueryBlock = 64;

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

size_t block_rows(const AttentionDims& d) { return std::min(d.T, kQueryBlock); }

ZERODP_NN_CLONES float row_max(const float* x, size_t n) { return max_of(x, n); }

// x[u] = exp(x[u] - m) for u < n; returns their sum.
ZERODP_NN_CLONES float exp_shifted(float* x, float m, size_t n) {
  return sum_exp_shifted(x, x, m, n);
}

ZERODP_NN_CLONES void scale_row(float* x, float s, size_t n) {
  for (size_t u = 0; u < n; ++u) x[u] *= s;
}

// Softmax backward of one row in place: g[u] = p[u] (g[u] - sum_w p[w] g[w]).
ZERODP_NN_CLONES void softmax_backward_row(float* g, const float* p, size_t n) {
  Lanes lane = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) lane += load_lanes(p + i) * load_lanes(g + i);
  float dot = combine(lane);
  for (; i < n; ++i) dot += p[i] * g[i];
  for (size_t u = 0; u < n; ++u) g[u] = p[u] * (g[u] - dot);
}

// Scores of query rows [r0, r0 + rows) against keys [0, keys) into tile (rows, keys), then
// each row t's probabilities over keys 0..t (exactly 0 after t), with the rows' (max,
// 1 / sum) from `stats`. Forward passes `fill` (the same place) to compute them first; backward
// passes the saved ones, which its recomputed scores reproduce.
void probabilities(std::span<float> tile, std::span<const float> q, std::span<const float> k,
                   size_t ld_qkv, size_t r0, size_t rows, size_t keys, size_t hs, float scale,
                   const float* stats, float* fill, GemmCompute compute) {
  gemm(compute, Transpose::kNo, Transpose::kYes, rows, keys, hs, scale, q.subspan(r0 * ld_qkv),
       ld_qkv, k, ld_qkv, 0.0f, tile, keys);
  for (size_t i = 0; i < rows; ++i) {
    float* row = tile.data() + i * keys;
    const size_t valid = r0 + i + 1;
    const float* st = stats + 2 * i;
    if (fill) {
      fill[2 * i] = row_max(row, valid);
      fill[2 * i + 1] = 1.0f / exp_shifted(row, st[0], valid);
    } else {
      exp_shifted(row, st[0], valid);
    }
    scale_row(row, st[1], valid);
    std::fill(row + valid, row + keys, 0.0f);
  }
}

}  // namespace

size_t attention_saved_count(const AttentionDims& d) { return d.B * d.NH * d.T * 2; }
size_t attention_scratch_count(const AttentionDims& d) { return 2 * block_rows(d) * d.T; }

void attention_forward(std::span<float> out, std::span<float> saved, std::span<float> scratch,
                       std::span<const float> qkv, const AttentionDims& d, GemmCompute compute) {
  check_dims("attention_forward", d);
  const std::string shape = shape_of(d);
  check_count("attention_forward", "out", out, d.B * d.T * d.C, shape);
  check_count("attention_forward", "saved", saved, attention_saved_count(d), shape);
  check_count("attention_forward", "scratch", scratch, attention_scratch_count(d), shape);
  check_count("attention_forward", "qkv", qkv, d.B * d.T * 3 * d.C, shape);
  if (d.B == 0 || d.T == 0) return;  // (and no subspan below may start past an empty end)
  const size_t T = d.T;
  const size_t C = d.C;
  const size_t hs = d.head_size();
  const size_t ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t R = block_rows(d);
  // Each block reads the keys and values of all earlier ones.
  const Bf16Operands qkv16(compute, qkv);
  for (size_t b = 0; b < d.B; ++b) {
    for (size_t h = 0; h < d.NH; ++h) {
      const auto q = qkv.subspan(qkv_offset(d, b, h));  // (T, hs), row stride 3C
      const auto k = q.subspan(C);
      const auto v = q.subspan(2 * C);
      const auto o = out.subspan(out_offset(d, b, h));  // (T, hs), row stride C
      float* stats = saved.data() + (b * d.NH + h) * T * 2;
      for (size_t r0 = 0; r0 < T; r0 += R) {
        const size_t rows = std::min(R, T - r0);
        const size_t keys = r0 + rows;
        const auto p = scratch.first(rows * keys);
        probabilities(p, q, k, ld, r0, rows, keys, hs, scale, stats + 2 * r0, stats + 2 * r0,
                      compute);
        // out rows (rows, hs) = p (rows, keys) @ v (keys, hs)
        gemm(compute, Transpose::kNo, Transpose::kNo, rows, hs, keys, 1.0f, p, keys, v, ld, 0.0f,
             o.subspan(r0 * C), C);
      }
    }
  }
}

void attention_backward(std::span<float> dqkv, std::span<float> scratch,
                        std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> saved, const AttentionDims& d, GemmCompute compute) {
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
  const size_t ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t R = block_rows(d);
  // q, k, v and dout each feed several products.
  const Bf16Operands qkv16(compute, qkv);
  const Bf16Operands dout16(compute, dout);
  for (size_t b = 0; b < d.B; ++b) {
    for (size_t h = 0; h < d.NH; ++h) {
      const auto q = qkv.subspan(qkv_offset(d, b, h));  // (T, hs), row stride 3C
      const auto k = q.subspan(C);
      const auto v = q.subspan(2 * C);
      const auto dq = dqkv.subspan(qkv_offset(d, b, h));  // (T, hs) +=, row stride 3C
      const auto dk = dq.subspan(C);
      const auto dv = dq.subspan(2 * C);
      const auto dout_bh = dout.subspan(out_offset(d, b, h));  // (T, hs), row stride C
      const float* stats = saved.data() + (b * d.NH + h) * T * 2;
      for (size_t r0 = 0; r0 < T; r0 += R) {
        const size_t rows = std::min(R, T - r0);
        const size_t keys = r0 + rows;
        const auto p = scratch.first(rows * keys);
        const auto g = scratch.subspan(R * T, rows * keys);
        probabilities(p, q, k, ld, r0, rows, keys, hs, scale, stats + 2 * r0, nullptr, compute);
        const auto dout_rows = dout_bh.subspan(r0 * C);
        // g (rows, keys) = dout rows (rows, hs) @ v^T
        gemm(compute, Transpose::kNo, Transpose::kYes, rows, keys, hs, 1.0f, dout_rows, C, v, ld,
             0.0f, g, keys);
        // dv (keys, hs) += p^T (keys, rows) @ dout rows (rows, hs)
        gemm(compute, Transpose::kYes, Transpose::kNo, keys, hs, rows, 1.0f, p, keys, dout_rows, C,
             1.0f, dv, ld);
        // d(scores) over keys 0..t of row t; 0 for later keys, whose probabilities were 0.
        for (size_t i = 0; i < rows; ++i) {
          float* gi = g.data() + i * keys;
          const size_t valid = r0 + i + 1;
          softmax_backward_row(gi, p.data() + i * keys, valid);
          std::fill(gi + valid, gi + keys, 0.0f);
        }
        const Bf16Operands g16(compute, g);  // read by both products below
        // scores = scale q k^T: dq rows += scale g @ k, dk (keys) += scale g^T @ q rows
        gemm(compute, Transpose::kNo, Transpose::kNo, rows, hs, keys, scale, g, keys, k, ld, 1.0f,
             dq.subspan(r0 * ld), ld);
        gemm(compute, Transpose::kYes, Transpose::kNo, keys, hs, rows, scale, g, keys,
             q.subspan(r0 * ld), ld, 1.0f, dk, ld);
      }
    }
  }
}

std::vector<GemmShape> attention_products(const AttentionDims& d) {
  std::vector<GemmShape> p;
  if (d.B == 0 || d.T == 0 || d.NH == 0) return p;
  const size_t hs = d.head_size();
  const size_t R = block_rows(d);
  // Per query block, as the loops above call them: scores (forward and backward's
  // recomputation) and g = dout v^T are NT; p v and g k are NN; p^T dout and g^T q are TN.
  for (size_t r0 = 0; r0 < d.T; r0 += R) {
    const size_t rows = std::min(R, d.T - r0);
    const size_t keys = r0 + rows;
    p.push_back({Transpose::kNo, Transpose::kYes, rows, keys, hs});
    p.push_back({Transpose::kNo, Transpose::kNo, rows, hs, keys});
    p.push_back({Transpose::kYes, Transpose::kNo, keys, hs, rows});
  }
  return p;
}

}  // namespace zerodp
