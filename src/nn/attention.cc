// Causal self-attention, a group of (batch, head) pairs at a time, in blocks of query rows.
//
// A block of up to kQueryBlock query rows sees keys 0..(its last row): its scores are one
// (rows, keys) tile per pair in scratch, never the whole (T, T) matrix, and the keys after the
// block's last row are never multiplied (about half the products at large T). Forward keeps
// each row's max score and 1 / sum of exponentials; backward recomputes the tiles' scores
// with the same product and shape and so gets the same probabilities, bit for bit. Each
// product kind is one gemm_batched call over the group's pairs, which it reads in place inside
// the (B, T, 3*C) and (B, T, C) buffers; dK and dV accumulate over the query blocks in their
// fixed order. Forward and backward are written once, over fp32 or bf16 qkv (and out).
#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

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

// The (batch, head) pairs one batched product covers: `seqs` whole sequences (all heads), or
// when one sequence's tiles exceed the budget, `heads` heads of one sequence. A pure function
// of the dims, so the products' shapes, and with them the bits, are too.
struct Group {
  size_t seqs = 1;
  size_t heads = 1;
};

// Scratch floats the tiles of one batched call may take (512 KB): 16 pairs of GPT-small
// (4 sequences), 8 of medium (one sequence), one alone from T = 1024. bench_layers'
// attention rows (this machine, one thread) ran best from 128 Ki to 512 Ki floats: at 32 Ki
// small's forward took 484 us instead of 421, at 4 Mi (every pair at once) small's fp32 got
// slower again (448 us) as the tiles left L2.
constexpr size_t kScratchBudget = size_t{128} << 10;

Group group_for(const AttentionDims& d) {
  const size_t per_pair = 2 * block_rows(d) * d.T;  // p and g tiles of one (batch, head)
  const size_t pairs = std::max<size_t>(1, kScratchBudget / std::max<size_t>(per_pair, 1));
  if (pairs >= d.NH) return {std::max<size_t>(1, std::min(pairs / d.NH, d.B)), d.NH};
  return {1, pairs};
}

// Views over the pairs of one group at one query block: where each operand's entries start
// and how they are strided, for gemm_batched.
struct Block {
  size_t b0, h0, S, H;  // sequences [b0, b0 + S), heads [h0, h0 + H)
  size_t r0, rows, keys;
};

// Where the group's first pair (sequence b0, head h0) starts, row 0, in a (B, T, width) buffer.
size_t view_offset(const AttentionDims& d, const Block& k, size_t width) {
  return k.b0 * d.T * width + k.h0 * d.head_size();
}

// A batch whose A and B are both (batch, head) slices of (B, T, width_a) and (B, T, width_b)
// buffers, or a tile (tile_a / tile_b true: (rows, keys) tiles, dense, one per pair); C
// likewise.
GemmBatch batch_of(const AttentionDims& d, const Block& k, size_t wa, size_t wb, size_t wc) {
  // width 0 marks a tile operand.
  const size_t tile = k.rows * k.keys;
  auto outer = [&](size_t w) { return w == 0 ? k.H * tile : d.T * w; };
  auto inner = [&](size_t w) { return w == 0 ? tile : d.head_size(); };
  return {.outer = k.S,
          .inner = k.H,
          .outer_a = outer(wa),
          .outer_b = outer(wb),
          .outer_c = outer(wc),
          .inner_a = inner(wa),
          .inner_b = inner(wb),
          .inner_c = inner(wc)};
}

template <typename T>
std::span<const float> fp32_or_none(std::span<const T> x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return {};
  }
}

// Scores of the block's query rows against keys [0, keys) into `tile` (one (rows, keys) tile
// per pair, pair (s, h) at (s H + h) rows keys), then each row t's probabilities over keys
// 0..t (exactly 0 after t), with the rows' (max, 1 / sum) from `stats` ((B, NH, T, 2)).
// Forward passes `fill` (the same place) to compute them first; backward passes null and the
// saved ones, which its recomputed scores reproduce.
template <typename Qkv>
void probabilities(std::span<float> tile, std::span<const Qkv> qkv, const float* stats, float* fill,
                   const AttentionDims& d, const Block& k, float scale, GemmCompute compute) {
  const size_t C = d.C, ld = 3 * C, T = d.T;
  const auto q = qkv.subspan(view_offset(d, k, ld) + k.r0 * ld);
  const auto key = qkv.subspan(view_offset(d, k, ld) + C);
  gemm_batched(compute, Transpose::kNo, Transpose::kYes, k.rows, k.keys, d.head_size(), scale, q,
               ld, key, ld, 0.0f, tile, k.keys, batch_of(d, k, ld, ld, 0));
  for (size_t s = 0; s < k.S; ++s) {
    for (size_t h = 0; h < k.H; ++h) {
      float* pair = tile.data() + (s * k.H + h) * k.rows * k.keys;
      const size_t first = ((k.b0 + s) * d.NH + k.h0 + h) * T * 2 + 2 * k.r0;
      for (size_t i = 0; i < k.rows; ++i) {
        float* row = pair + i * k.keys;
        const size_t valid = k.r0 + i + 1;
        const float* st = stats + first + 2 * i;
        if (fill) {
          fill[first + 2 * i] = row_max(row, valid);
          fill[first + 2 * i + 1] = 1.0f / exp_shifted(row, st[0], valid);
        } else {
          exp_shifted(row, st[0], valid);
        }
        scale_row(row, st[1], valid);
        std::fill(row + valid, row + k.keys, 0.0f);
      }
    }
  }
}

// Calls fn(block) for every group of pairs and query block, in a fixed order.
template <typename Fn>
void for_each_block(const AttentionDims& d, Fn&& fn) {
  const Group g = group_for(d);
  const size_t R = block_rows(d);
  for (size_t b0 = 0; b0 < d.B; b0 += g.seqs) {
    for (size_t h0 = 0; h0 < d.NH; h0 += g.heads) {
      for (size_t r0 = 0; r0 < d.T; r0 += R) {
        const size_t rows = std::min(R, d.T - r0);
        fn(Block{.b0 = b0,
                 .h0 = h0,
                 .S = std::min(g.seqs, d.B - b0),
                 .H = std::min(g.heads, d.NH - h0),
                 .r0 = r0,
                 .rows = rows,
                 .keys = r0 + rows});
      }
    }
  }
}

template <typename Qkv, typename Out>
void forward_impl(std::span<Out> out, std::span<float> saved, std::span<float> scratch,
                  std::span<const Qkv> qkv, const AttentionDims& d, GemmCompute compute) {
  check_dims("attention_forward", d);
  const std::string shape = shape_of(d);
  check_count("attention_forward", "out", out, d.B * d.T * d.C, shape);
  check_count("attention_forward", "saved", saved, attention_saved_count(d), shape);
  check_count("attention_forward", "scratch", scratch, attention_scratch_count(d), shape);
  check_count("attention_forward", "qkv", qkv, d.B * d.T * 3 * d.C, shape);
  if (d.B == 0 || d.T == 0) return;  // (and no subspan below may start past an empty end)
  const size_t C = d.C;
  const size_t ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.head_size()));
  // Each block reads the keys and values of all earlier ones.
  const Bf16Operands qkv16(compute, fp32_or_none(qkv));
  for_each_block(d, [&](const Block& k) {
    const auto p = scratch.first(k.S * k.H * k.rows * k.keys);
    probabilities(p, qkv, saved.data(), saved.data(), d, k, scale, compute);
    // out rows (rows, hs) = p (rows, keys) @ v (keys, hs)
    gemm_batched(compute, Transpose::kNo, Transpose::kNo, k.rows, d.head_size(), k.keys, 1.0f,
                 std::span<const float>(p), k.keys, qkv.subspan(view_offset(d, k, ld) + 2 * C), ld,
                 0.0f, out.subspan(view_offset(d, k, C) + k.r0 * C), C, batch_of(d, k, 0, ld, C));
  });
}

template <typename Qkv>
void backward_impl(std::span<float> dqkv, std::span<float> scratch, std::span<const float> dout,
                   std::span<const Qkv> qkv, std::span<const float> saved, const AttentionDims& d,
                   GemmCompute compute) {
  check_dims("attention_backward", d);
  const std::string shape = shape_of(d);
  check_count("attention_backward", "dqkv", dqkv, d.B * d.T * 3 * d.C, shape);
  check_count("attention_backward", "scratch", scratch, attention_scratch_count(d), shape);
  check_count("attention_backward", "dout", dout, d.B * d.T * d.C, shape);
  check_count("attention_backward", "qkv", qkv, d.B * d.T * 3 * d.C, shape);
  check_count("attention_backward", "saved", saved, attention_saved_count(d), shape);
  if (d.B == 0 || d.T == 0) return;
  const size_t C = d.C;
  const size_t hs = d.head_size();
  const size_t ld = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t half = attention_scratch_count(d) / 2;
  // q, k, v and dout each feed several products.
  const Bf16Operands qkv16(compute, fp32_or_none(qkv));
  const Bf16Operands dout16(compute, dout);
  for_each_block(d, [&](const Block& k) {
    const size_t tiles = k.S * k.H * k.rows * k.keys;
    const auto p = scratch.first(tiles);
    const auto g = scratch.subspan(half, tiles);
    probabilities(p, qkv, saved.data(), nullptr, d, k, scale, compute);
    const size_t at = view_offset(d, k, ld);  // q of the group's first pair, row 0
    const auto q_rows = qkv.subspan(at + k.r0 * ld);
    const auto key = qkv.subspan(at + C);
    const auto v = qkv.subspan(at + 2 * C);
    const auto dq_rows = dqkv.subspan(at + k.r0 * ld);
    const auto dk = dqkv.subspan(at + C);
    const auto dv = dqkv.subspan(at + 2 * C);
    const auto dout_rows = dout.subspan(view_offset(d, k, C) + k.r0 * C);
    // g (rows, keys) = dout rows (rows, hs) @ v^T
    gemm_batched(compute, Transpose::kNo, Transpose::kYes, k.rows, k.keys, hs, 1.0f, dout_rows, C,
                 v, ld, 0.0f, g, k.keys, batch_of(d, k, C, ld, 0));
    // dv (keys, hs) += p^T (keys, rows) @ dout rows (rows, hs)
    gemm_batched(compute, Transpose::kYes, Transpose::kNo, k.keys, hs, k.rows, 1.0f,
                 std::span<const float>(p), k.keys, dout_rows, C, 1.0f, dv, ld,
                 batch_of(d, k, 0, C, ld));
    // d(scores) over keys 0..t of row t; 0 for later keys, whose probabilities were 0.
    for (size_t e = 0; e < k.S * k.H; ++e) {
      for (size_t i = 0; i < k.rows; ++i) {
        float* gi = g.data() + (e * k.rows + i) * k.keys;
        const float* pi = p.data() + (e * k.rows + i) * k.keys;
        const size_t valid = k.r0 + i + 1;
        softmax_backward_row(gi, pi, valid);
        std::fill(gi + valid, gi + k.keys, 0.0f);
      }
    }
    const Bf16Operands g16(compute, g);  // read by both products below
    // scores = scale q k^T: dq rows += scale g @ k, dk (keys) += scale g^T @ q rows
    gemm_batched(compute, Transpose::kNo, Transpose::kNo, k.rows, hs, k.keys, scale,
                 std::span<const float>(g), k.keys, key, ld, 1.0f, dq_rows, ld,
                 batch_of(d, k, 0, ld, ld));
    gemm_batched(compute, Transpose::kYes, Transpose::kNo, k.keys, hs, k.rows, scale,
                 std::span<const float>(g), k.keys, q_rows, ld, 1.0f, dk, ld,
                 batch_of(d, k, 0, ld, ld));
  });
}

void require_bf16(std::string_view fn, GemmCompute compute) {
  if (compute != GemmCompute::kBF16) {
    throw InvalidArgument(fmt::format(
        "{}: bf16 qkv needs compute bf16, got fp32; widen qkv to fp32 or compute in bf16", fn));
  }
}

}  // namespace

size_t attention_saved_count(const AttentionDims& d) { return d.B * d.NH * d.T * 2; }
size_t attention_scratch_count(const AttentionDims& d) {
  if (d.NH == 0) return 0;
  const Group g = group_for(d);
  return 2 * std::min(g.seqs, std::max<size_t>(d.B, 1)) * std::min(g.heads, d.NH) * block_rows(d) *
         d.T;
}

void attention_forward(std::span<float> out, std::span<float> saved, std::span<float> scratch,
                       std::span<const float> qkv, const AttentionDims& d, GemmCompute compute) {
  forward_impl(out, saved, scratch, qkv, d, compute);
}

void attention_forward(std::span<BFloat16> out, std::span<float> saved, std::span<float> scratch,
                       std::span<const BFloat16> qkv, const AttentionDims& d, GemmCompute compute) {
  require_bf16("attention_forward", compute);
  forward_impl(out, saved, scratch, qkv, d, compute);
}

void attention_backward(std::span<float> dqkv, std::span<float> scratch,
                        std::span<const float> dout, std::span<const float> qkv,
                        std::span<const float> saved, const AttentionDims& d, GemmCompute compute) {
  backward_impl(dqkv, scratch, dout, qkv, saved, d, compute);
}

void attention_backward(std::span<float> dqkv, std::span<float> scratch,
                        std::span<const float> dout, std::span<const BFloat16> qkv,
                        std::span<const float> saved, const AttentionDims& d, GemmCompute compute) {
  require_bf16("attention_backward", compute);
  backward_impl(dqkv, scratch, dout, qkv, saved, d, compute);
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
