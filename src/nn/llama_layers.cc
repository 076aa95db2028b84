// RMSNorm, rotary position embedding and SwiGLU: the layers the Llama family adds to the
// GPT's (nn/layers.h). Sums run in double per row, in index order: a row's result depends on
// that row alone, and the loops are not yet the vectorized lanes layernorm.cc uses.
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "nn/check.h"
#include "nn/layers.h"

namespace zerodp {

using nn_detail::check_count;

void rmsnorm_forward(std::span<float> out, std::span<float> rstd, std::span<const float> inp,
                     std::span<const float> weight, size_t rows, size_t C, float eps) {
  const std::string shape = fmt::format("(rows={}, C={})", rows, C);
  check_count("rmsnorm_forward", "out", out, rows * C, shape);
  check_count("rmsnorm_forward", "rstd", rstd, rows, shape);
  check_count("rmsnorm_forward", "inp", inp, rows * C, shape);
  check_count("rmsnorm_forward", "weight", weight, C, shape);
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp.data() + r * C;
    double sq = 0;
    for (size_t i = 0; i < C; ++i) sq += static_cast<double>(x[i]) * x[i];
    const float s =
        static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(C) + static_cast<double>(eps)));
    rstd[r] = s;
    float* y = out.data() + r * C;
    for (size_t i = 0; i < C; ++i) y[i] = x[i] * s * weight[i];
  }
}

void rmsnorm_backward(std::span<float> dinp, std::span<float> dweight, std::span<const float> dout,
                      std::span<const float> inp, std::span<const float> weight,
                      std::span<const float> rstd, size_t rows, size_t C) {
  const std::string shape = fmt::format("(rows={}, C={})", rows, C);
  check_count("rmsnorm_backward", "dinp", dinp, rows * C, shape);
  check_count("rmsnorm_backward", "dweight", dweight, C, shape);
  check_count("rmsnorm_backward", "dout", dout, rows * C, shape);
  check_count("rmsnorm_backward", "inp", inp, rows * C, shape);
  check_count("rmsnorm_backward", "weight", weight, C, shape);
  check_count("rmsnorm_backward", "rstd", rstd, rows, shape);
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp.data() + r * C;
    const float* dy = dout.data() + r * C;
    const float s = rstd[r];
    // y = x s w with s = (mean(x^2) + eps)^(-1/2): dx = s (w dy) - x s^3 mean(w dy x).
    double dot = 0;
    for (size_t i = 0; i < C; ++i) dot += static_cast<double>(dy[i]) * weight[i] * x[i];
    const float k = static_cast<float>(dot / static_cast<double>(C)) * s * s * s;
    float* dx = dinp.data() + r * C;
    for (size_t i = 0; i < C; ++i) {
      dx[i] += s * weight[i] * dy[i] - x[i] * k;
      dweight[i] += dy[i] * x[i] * s;
    }
  }
}

RopeTable rope_table(size_t max_T, size_t head_size, float theta) {
  if (head_size == 0 || head_size % 2 != 0) {
    throw InvalidArgument(fmt::format(
        "rope_table: head size {} is not even; rotary embedding pairs a head's two halves",
        head_size));
  }
  if (!(theta > 1.0f) || !std::isfinite(theta)) {
    throw InvalidArgument(
        fmt::format("rope_table: theta {} is invalid; use a base above 1, "
                    "e.g. 10000",
                    theta));
  }
  RopeTable t{.max_T = max_T, .half = head_size / 2, .cos = {}, .sin = {}};
  std::vector<float> inv_freq(t.half);
  for (size_t i = 0; i < t.half; ++i) {
    inv_freq[i] = static_cast<float>(
        std::pow(static_cast<double>(theta),
                 -2.0 * static_cast<double>(i) / static_cast<double>(head_size)));
  }
  t.cos.resize(max_T * t.half);
  t.sin.resize(max_T * t.half);
  for (size_t p = 0; p < max_T; ++p) {
    for (size_t i = 0; i < t.half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      t.cos[p * t.half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      t.sin[p * t.half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return t;
}

namespace {

void check_rope(std::string_view fn, std::span<const float> a, std::string_view a_name,
                std::span<const float> b, std::string_view b_name, const RopeTable& table, size_t B,
                size_t T, size_t heads, size_t HS) {
  const std::string shape = fmt::format("(B={}, T={}, heads={}, HS={})", B, T, heads, HS);
  check_count(fn, a_name, a, B * T * heads * HS, shape);
  check_count(fn, b_name, b, B * T * heads * HS, shape);
  if (HS != 2 * table.half || T > table.max_T) {
    throw InvalidArgument(fmt::format(
        "{}: the table is for head size {} and {} positions; {} needs head size {} and {}", fn,
        2 * table.half, table.max_T, shape, HS, T));
  }
}

}  // namespace

namespace {

// Turns every half pair of `from` by its angle times `sign` into `to`: forward turns by +angle,
// backward by -angle (the transpose) and adds.
void rope_turn(std::span<float> to, std::span<const float> from, const RopeTable& table, size_t B,
               size_t T, size_t heads, size_t HS, float sign, bool add) {
  const size_t h = table.half;
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      const float* c = table.cos.data() + t * h;
      const float* s = table.sin.data() + t * h;
      for (size_t n = 0; n < heads; ++n) {
        const size_t at = ((b * T + t) * heads + n) * HS;
        const float* x = from.data() + at;
        float* y = to.data() + at;
        for (size_t i = 0; i < h; ++i) {
          const float turn = sign * s[i];
          const float lo = x[i] * c[i] - x[i + h] * turn;
          const float hi = x[i + h] * c[i] + x[i] * turn;
          y[i] = add ? y[i] + lo : lo;
          y[i + h] = add ? y[i + h] + hi : hi;
        }
      }
    }
  }
}

}  // namespace

void rope_forward(std::span<float> out, std::span<const float> inp, const RopeTable& table,
                  size_t B, size_t T, size_t heads, size_t HS) {
  check_rope("rope_forward", out, "out", inp, "inp", table, B, T, heads, HS);
  rope_turn(out, inp, table, B, T, heads, HS, 1.0f, false);
}

void rope_backward(std::span<float> dinp, std::span<const float> dout, const RopeTable& table,
                   size_t B, size_t T, size_t heads, size_t HS) {
  check_rope("rope_backward", dinp, "dinp", dout, "dout", table, B, T, heads, HS);
  rope_turn(dinp, dout, table, B, T, heads, HS, -1.0f, true);
}

void swiglu_forward(std::span<float> out, std::span<const float> gate, std::span<const float> up) {
  const std::string shape = fmt::format("(count={})", out.size());
  check_count("swiglu_forward", "gate", gate, out.size(), shape);
  check_count("swiglu_forward", "up", up, out.size(), shape);
  for (size_t i = 0; i < out.size(); ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu_backward(std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                     std::span<const float> gate, std::span<const float> up) {
  const std::string shape = fmt::format("(count={})", dout.size());
  check_count("swiglu_backward", "dgate", dgate, dout.size(), shape);
  check_count("swiglu_backward", "dup", dup, dout.size(), shape);
  check_count("swiglu_backward", "gate", gate, dout.size(), shape);
  check_count("swiglu_backward", "up", up, dout.size(), shape);
  for (size_t i = 0; i < dout.size(); ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    // silu'(g) = sig (1 + g (1 - sig)).
    dgate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    dup[i] += dout[i] * g * sig;
  }
}

namespace {

void check_repeat_kv(std::string_view fn, std::span<const float> wide, std::string_view wide_name,
                     std::span<const float> narrow, std::string_view narrow_name, size_t rows,
                     size_t heads, size_t kv_heads, size_t HS) {
  const std::string shape =
      fmt::format("(rows={}, heads={}, kv_heads={}, HS={})", rows, heads, kv_heads, HS);
  if (kv_heads == 0 || heads % kv_heads != 0) {
    throw InvalidArgument(fmt::format(
        "{}: kv_heads {} does not divide heads {}; each kv head serves heads / kv_heads query "
        "heads",
        fn, kv_heads, heads));
  }
  check_count(fn, wide_name, wide, rows * heads * HS, shape);
  check_count(fn, narrow_name, narrow, rows * kv_heads * HS, shape);
}

}  // namespace

void repeat_kv_forward(std::span<float> out, std::span<const float> inp, size_t rows, size_t heads,
                       size_t kv_heads, size_t HS) {
  check_repeat_kv("repeat_kv_forward", out, "out", inp, "inp", rows, heads, kv_heads, HS);
  const size_t group = heads / kv_heads;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t h = 0; h < heads; ++h) {
      const float* from = inp.data() + (r * kv_heads + h / group) * HS;
      std::copy(from, from + HS, out.data() + (r * heads + h) * HS);
    }
  }
}

void repeat_kv_backward(std::span<float> dinp, std::span<const float> dout, size_t rows,
                        size_t heads, size_t kv_heads, size_t HS) {
  check_repeat_kv("repeat_kv_backward", dout, "dout", dinp, "dinp", rows, heads, kv_heads, HS);
  const size_t group = heads / kv_heads;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t h = 0; h < heads; ++h) {
      const float* from = dout.data() + (r * heads + h) * HS;
      float* to = dinp.data() + (r * kv_heads + h / group) * HS;
      for (size_t i = 0; i < HS; ++i) to[i] += from[i];
    }
  }
}

size_t head_cross_entropy_scratch_count(size_t V) { return 2 * kHeadBlockRows * V; }

float head_cross_entropy(std::span<float> dinp, std::span<float> dweight, std::span<float> scratch,
                         std::span<const float> inp, std::span<const float> weight,
                         std::span<const int32_t> targets, size_t rows, size_t C, size_t V,
                         GemmCompute compute, float dloss) {
  const std::string shape = fmt::format("(rows={}, C={}, V={})", rows, C, V);
  nn_detail::check_optional_count("head_cross_entropy", "dinp", dinp, rows * C, shape);
  nn_detail::check_optional_count("head_cross_entropy", "dweight", dweight, V * C, shape);
  check_count("head_cross_entropy", "scratch", scratch, head_cross_entropy_scratch_count(V), shape);
  check_count("head_cross_entropy", "inp", inp, rows * C, shape);
  check_count("head_cross_entropy", "weight", weight, V * C, shape);
  check_count("head_cross_entropy", "targets", targets, rows, shape);
  if (!dinp.empty() && dweight.empty()) {
    throw InvalidArgument(fmt::format(
        "head_cross_entropy: dinp is given without dweight {}; pass both for the backward, or "
        "neither for the loss alone",
        shape));
  }
  const bool grads = !dweight.empty();
  size_t counted = 0;
  for (const int32_t t : targets) counted += t == kIgnoreTarget ? 0 : 1;
  if (counted == 0) return 0;
  double loss = 0;
  for (size_t r0 = 0; r0 < rows; r0 += kHeadBlockRows) {
    const size_t n = std::min(kHeadBlockRows, rows - r0);
    const std::span<float> logits = scratch.subspan(0, n * V);
    const std::span<float> dlogits = scratch.subspan(kHeadBlockRows * V, n * V);
    const std::span<const float> x = inp.subspan(r0 * C, n * C);
    const std::span<const int32_t> t = targets.subspan(r0, n);
    size_t here = 0;
    for (const int32_t v : t) here += v == kIgnoreTarget ? 0 : 1;
    if (here == 0) continue;
    linear_forward(logits, x, weight, {}, n, C, V, compute);
    // The block's mean scaled to its share of all counted rows: the sum over blocks is the
    // mean over every row, and each gradient is dloss / counted per row.
    const double share = static_cast<double>(here) / static_cast<double>(counted);
    if (grads) std::fill(dlogits.begin(), dlogits.end(), 0.0f);
    const float block_loss = cross_entropy_forward_backward(
        grads ? dlogits : std::span<float>(), logits, t, n, V, static_cast<float>(dloss * share));
    loss += static_cast<double>(block_loss) * share;
    if (!grads) continue;
    linear_backward(dinp.empty() ? std::span<float>() : dinp.subspan(r0 * C, n * C), dweight, {},
                    dlogits, x, weight, n, C, V, compute);
  }
  return static_cast<float>(loss);
}

}  // namespace zerodp
