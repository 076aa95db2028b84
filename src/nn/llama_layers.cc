// The embedding, RMSNorm, rotary position embedding, SwiGLU, grouped-query sharing and the
// blocked head: the layers the Llama family adds to the GPT's (nn/layers.h). Row sums run in
// layernorm.cc's fixed lanes (nn/vecmath.h) and the elementwise loops are cloned per ISA with
// the same bits: a row's result depends on that row alone. Layers that write a product's input
// under kBF16 (RMSNorm, SwiGLU's rows, the rotary pack) compute a row in fp32, then round it with
// convert(), as layernorm.cc does: the bits a product rounding the fp32 row would read.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "nn/check.h"
#include "nn/layers.h"
#include "nn/vecmath.h"
#include "tensor/dtype.h"

namespace zerodp {

using nn_detail::check_count;
using nn_detail::check_size;
using nn_detail::combine;
using nn_detail::exp_nonpositive;
using nn_detail::kLanes;
using nn_detail::Lanes;
using nn_detail::load_lanes;

namespace {

// Where a layer writes a row: straight into fp32 `out`, or into a row kept on the thread
// (L1-sized) that finish() rounds into bf16 `out`.
template <typename Out>
class RowWriter {
 public:
  RowWriter(std::span<Out> out, size_t width) : out_(out), width_(width) {
    if constexpr (!std::is_same_v<Out, float>) row32().resize(width);
  }
  float* row(size_t r) {
    if constexpr (std::is_same_v<Out, float>) {
      return out_.data() + r * width_;
    } else {
      (void)r;
      return row32().data();
    }
  }
  void finish(size_t r) {
    if constexpr (!std::is_same_v<Out, float>) {
      convert(std::span<const float>(row32()), out_.subspan(r * width_, width_));
    }
  }

 private:
  static std::vector<float>& row32() {
    thread_local std::vector<float> row;
    return row;
  }
  std::span<Out> out_;
  size_t width_;
};

// Calls body(writer) with a RowWriter over the GemmResult's fp32 or bf16 values.
template <typename Body>
void with_rows(GemmResult out, size_t width, Body&& body) {
  if (out.is_bf16()) {
    body(RowWriter<BFloat16>(out.bf16(), width));
  } else {
    body(RowWriter<float>(out.f32(), width));
  }
}

void check_tokens(std::string_view fn, std::span<const int32_t> tokens, size_t T, size_t V) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= V) {
      throw InvalidArgument(fmt::format("{}: token {} at (b={}, t={}) is outside [0, V={})", fn,
                                        tokens[i], i / T, i % T, V));
    }
  }
}

}  // namespace

void embedding_forward(std::span<float> out, std::span<const int32_t> tokens,
                       std::span<const float> wte, size_t B, size_t T, size_t C, size_t V) {
  const std::string shape = fmt::format("(B={}, T={}, C={}, V={})", B, T, C, V);
  check_count("embedding_forward", "out", out, B * T * C, shape);
  check_count("embedding_forward", "tokens", tokens, B * T, shape);
  check_count("embedding_forward", "wte", wte, V * C, shape);
  check_tokens("embedding_forward", tokens, T, V);
  for (size_t r = 0; r < B * T; ++r) {
    const float* from = wte.data() + static_cast<size_t>(tokens[r]) * C;
    std::copy(from, from + C, out.data() + r * C);
  }
}

void embedding_backward(std::span<float> dwte, std::span<const float> dout,
                        std::span<const int32_t> tokens, size_t B, size_t T, size_t C, size_t V) {
  const std::string shape = fmt::format("(B={}, T={}, C={}, V={})", B, T, C, V);
  check_count("embedding_backward", "dwte", dwte, V * C, shape);
  check_count("embedding_backward", "dout", dout, B * T * C, shape);
  check_count("embedding_backward", "tokens", tokens, B * T, shape);
  check_tokens("embedding_backward", tokens, T, V);
  for (size_t r = 0; r < B * T; ++r) {  // (b, t) order
    const float* from = dout.data() + r * C;
    float* to = dwte.data() + static_cast<size_t>(tokens[r]) * C;
    for (size_t i = 0; i < C; ++i) to[i] += from[i];
  }
}

namespace {

// RMSNorm's row sums in kLanes partial sums combined in a fixed order (layernorm.cc's way):
// the same bits in every clone and lane, a row's result from that row alone.
ZERODP_NN_CLONES float row_sum_sq(const float* x, size_t C) {
  Lanes lane = {};
  size_t i = 0;
  for (; i + kLanes <= C; i += kLanes) {
    const Lanes v = load_lanes(x + i);
    lane += v * v;
  }
  float sum = combine(lane);
  for (; i < C; ++i) sum += x[i] * x[i];
  return sum;
}

ZERODP_NN_CLONES void rms_scale(float* __restrict y, const float* __restrict x, float s,
                                const float* __restrict weight, size_t C) {
  for (size_t i = 0; i < C; ++i) y[i] = x[i] * s * weight[i];
}

// y = x s w with s = (mean(x^2) + eps)^(-1/2): dx = s (w dy) - x s^3 mean(w dy x).
ZERODP_NN_CLONES void rms_row_backward(float* __restrict dx, float* __restrict dweight,
                                       const float* __restrict dy, const float* __restrict x,
                                       const float* __restrict weight, float s, float inv_c,
                                       size_t C) {
  Lanes lane = {};
  size_t i = 0;
  for (; i + kLanes <= C; i += kLanes) {
    lane += load_lanes(dy + i) * load_lanes(weight + i) * load_lanes(x + i);
  }
  float dot = combine(lane);
  for (; i < C; ++i) dot += dy[i] * weight[i] * x[i];
  const float k = dot * inv_c * s * s * s;
  for (i = 0; i < C; ++i) {
    dx[i] += s * weight[i] * dy[i] - x[i] * k;
    dweight[i] += dy[i] * x[i] * s;
  }
}

}  // namespace

void rmsnorm_forward(GemmResult out, std::span<float> rstd, std::span<const float> inp,
                     std::span<const float> weight, size_t rows, size_t C, float eps) {
  const std::string shape = fmt::format("(rows={}, C={})", rows, C);
  check_size("rmsnorm_forward", "out", out.size(), rows * C, shape);
  check_count("rmsnorm_forward", "rstd", rstd, rows, shape);
  check_count("rmsnorm_forward", "inp", inp, rows * C, shape);
  check_count("rmsnorm_forward", "weight", weight, C, shape);
  if (C == 0) return;
  const float inv_c = 1.0f / static_cast<float>(C);
  with_rows(out, C, [&](auto&& rows_out) {
    for (size_t r = 0; r < rows; ++r) {
      const float* x = inp.data() + r * C;
      const float s = 1.0f / std::sqrt(row_sum_sq(x, C) * inv_c + eps);
      rstd[r] = s;
      rms_scale(rows_out.row(r), x, s, weight.data(), C);
      rows_out.finish(r);
    }
  });
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
  if (C == 0) return;
  const float inv_c = 1.0f / static_cast<float>(C);
  for (size_t r = 0; r < rows; ++r) {
    rms_row_backward(dinp.data() + r * C, dweight.data(), dout.data() + r * C, inp.data() + r * C,
                     weight.data(), rstd[r], inv_c, C);
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

// Turns every half pair of `heads` consecutive heads of one position's row, `from`, by the
// angles of position t times `sign` into `to`: forward turns by +angle and writes, backward by
// -angle (the transpose) and adds. Every rotary layer goes through here, so they share bits.
void rope_turn(float* to, const float* from, const RopeTable& table, size_t t, size_t heads,
               size_t HS, float sign, bool add) {
  const size_t h = table.half;
  const float* c = table.cos.data() + t * h;
  const float* s = table.sin.data() + t * h;
  for (size_t n = 0; n < heads; ++n) {
    const float* x = from + n * HS;
    float* y = to + n * HS;
    for (size_t i = 0; i < h; ++i) {
      const float turn = sign * s[i];
      const float lo = x[i] * c[i] - x[i + h] * turn;
      const float hi = x[i + h] * c[i] + x[i] * turn;
      y[i] = add ? y[i] + lo : lo;
      y[i + h] = add ? y[i + h] + hi : hi;
    }
  }
}

// rope_turn over every position of (B, T, heads, HS).
void rope_turn_all(std::span<float> to, std::span<const float> from, const RopeTable& table,
                   size_t B, size_t T, size_t heads, size_t HS, float sign, bool add) {
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      const size_t at = (b * T + t) * heads * HS;
      rope_turn(to.data() + at, from.data() + at, table, t, heads, HS, sign, add);
    }
  }
}

}  // namespace

void rope_forward(std::span<float> out, std::span<const float> inp, const RopeTable& table,
                  size_t B, size_t T, size_t heads, size_t HS) {
  check_rope("rope_forward", out, "out", inp, "inp", table, B, T, heads, HS);
  rope_turn_all(out, inp, table, B, T, heads, HS, 1.0f, false);
}

void rope_backward(std::span<float> dinp, std::span<const float> dout, const RopeTable& table,
                   size_t B, size_t T, size_t heads, size_t HS) {
  check_rope("rope_backward", dinp, "dinp", dout, "dout", table, B, T, heads, HS);
  rope_turn_all(dinp, dout, table, B, T, heads, HS, -1.0f, true);
}

namespace {

// SwiGLU's arithmetic, shared by the flat and the row layouts so they give the same bits.
// The sigmoid comes from the GELU's exp (nn/vecmath.h) of -|g|, never of a positive argument,
// so the loops vectorize in every clone with the same bits in every lane: glibc's scalar expf
// here took 16 % of a small llama's step (bench/vs_torch, docs/performance.md).
inline float sigmoid(float g) {
  const float e = exp_nonpositive(g < 0.0f ? g : -g);
  const float q = 1.0f / (1.0f + e);
  return g < 0.0f ? e * q : q;
}

ZERODP_NN_CLONES void swiglu_span(float* __restrict out, const float* __restrict gate,
                                  const float* __restrict up, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * sigmoid(g) * up[i];
  }
}

// silu'(g) = sig (1 + g (1 - sig)). Written (=) or added (+=) by `add`.
template <bool kAdd>
ZERODP_NN_CLONES void swiglu_backward_span(float* __restrict dgate, float* __restrict dup,
                                           const float* __restrict dout,
                                           const float* __restrict gate, const float* __restrict up,
                                           size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = sigmoid(g);
    const float dg = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
    const float du = dout[i] * g * sig;
    if constexpr (kAdd) {
      dgate[i] += dg;
      dup[i] += du;
    } else {
      dgate[i] = dg;
      dup[i] = du;
    }
  }
}

}  // namespace

void swiglu_forward(std::span<float> out, std::span<const float> gate, std::span<const float> up) {
  const std::string shape = fmt::format("(count={})", out.size());
  check_count("swiglu_forward", "gate", gate, out.size(), shape);
  check_count("swiglu_forward", "up", up, out.size(), shape);
  swiglu_span(out.data(), gate.data(), up.data(), out.size());
}

void swiglu_backward(std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                     std::span<const float> gate, std::span<const float> up) {
  const std::string shape = fmt::format("(count={})", dout.size());
  check_count("swiglu_backward", "dgate", dgate, dout.size(), shape);
  check_count("swiglu_backward", "dup", dup, dout.size(), shape);
  check_count("swiglu_backward", "gate", gate, dout.size(), shape);
  check_count("swiglu_backward", "up", up, dout.size(), shape);
  swiglu_backward_span<true>(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(),
                             dout.size());
}

void swiglu_rows_forward(GemmResult out, std::span<const float> gate_up, size_t rows, size_t F) {
  const std::string shape = fmt::format("(rows={}, F={})", rows, F);
  check_size("swiglu_rows_forward", "out", out.size(), rows * F, shape);
  check_count("swiglu_rows_forward", "gate_up", gate_up, rows * 2 * F, shape);
  with_rows(out, F, [&](auto&& rows_out) {
    for (size_t r = 0; r < rows; ++r) {
      const float* g = gate_up.data() + r * 2 * F;
      swiglu_span(rows_out.row(r), g, g + F, F);
      rows_out.finish(r);
    }
  });
}

void swiglu_rows_backward(std::span<float> dgate_up, std::span<const float> dout,
                          std::span<const float> gate_up, size_t rows, size_t F,
                          InputGrad dgate_up_mode) {
  const std::string shape = fmt::format("(rows={}, F={})", rows, F);
  check_count("swiglu_rows_backward", "dgate_up", dgate_up, rows * 2 * F, shape);
  check_count("swiglu_rows_backward", "dout", dout, rows * F, shape);
  check_count("swiglu_rows_backward", "gate_up", gate_up, rows * 2 * F, shape);
  for (size_t r = 0; r < rows; ++r) {
    const float* g = gate_up.data() + r * 2 * F;
    float* dg = dgate_up.data() + r * 2 * F;
    if (dgate_up_mode == InputGrad::kAdd) {
      swiglu_backward_span<true>(dg, dg + F, dout.data() + r * F, g, g + F, F);
    } else {
      swiglu_backward_span<false>(dg, dg + F, dout.data() + r * F, g, g + F, F);
    }
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

namespace {

void check_rope_qkv(std::string_view fn, size_t qkv_size, std::string_view qkv_name,
                    std::span<const float> proj, std::string_view proj_name, const RopeTable& table,
                    size_t B, size_t T, size_t heads, size_t kv_heads, size_t HS) {
  const std::string shape =
      fmt::format("(B={}, T={}, heads={}, kv_heads={}, HS={})", B, T, heads, kv_heads, HS);
  if (kv_heads == 0 || heads % kv_heads != 0) {
    throw InvalidArgument(fmt::format(
        "{}: kv_heads {} does not divide heads {}; each kv head serves heads / kv_heads query "
        "heads",
        fn, kv_heads, heads));
  }
  check_size(fn, qkv_name, qkv_size, B * T * 3 * heads * HS, shape);
  check_count(fn, proj_name, proj, B * T * (heads + 2 * kv_heads) * HS, shape);
  if (HS != 2 * table.half || T > table.max_T) {
    throw InvalidArgument(fmt::format(
        "{}: the table is for head size {} and {} positions; {} needs head size {} and {}", fn,
        2 * table.half, table.max_T, shape, HS, T));
  }
}

}  // namespace

void rope_qkv_forward(GemmResult qkv, std::span<const float> proj, const RopeTable& table, size_t B,
                      size_t T, size_t heads, size_t kv_heads, size_t HS) {
  check_rope_qkv("rope_qkv_forward", qkv.size(), "qkv", proj, "proj", table, B, T, heads, kv_heads,
                 HS);
  const size_t C = heads * HS, KV = kv_heads * HS, P = C + 2 * KV, group = heads / kv_heads;
  with_rows(qkv, 3 * C, [&](auto&& rows_out) {
    for (size_t r = 0; r < B * T; ++r) {
      const size_t t = r % T;
      const float* x = proj.data() + r * P;
      float* y = rows_out.row(r);
      rope_turn(y, x, table, t, heads, HS, 1.0f, false);  // q
      for (size_t g = 0; g < kv_heads; ++g) {
        // k: turned once into the group's first head, copied to the others.
        float* first = y + C + g * group * HS;
        rope_turn(first, x + C + g * HS, table, t, 1, HS, 1.0f, false);
        for (size_t j = 1; j < group; ++j) std::copy(first, first + HS, first + j * HS);
      }
      for (size_t h = 0; h < heads; ++h) {  // v
        const float* v = x + C + KV + (h / group) * HS;
        std::copy(v, v + HS, y + 2 * C + h * HS);
      }
      rows_out.finish(r);
    }
  });
}

void rope_qkv_backward(std::span<float> dproj, std::span<const float> dqkv, const RopeTable& table,
                       size_t B, size_t T, size_t heads, size_t kv_heads, size_t HS) {
  check_rope_qkv("rope_qkv_backward", dqkv.size(), "dqkv", dproj, "dproj", table, B, T, heads,
                 kv_heads, HS);
  const size_t C = heads * HS, KV = kv_heads * HS, P = C + 2 * KV, group = heads / kv_heads;
  thread_local std::vector<float> dk;
  dk.resize(HS);
  for (size_t r = 0; r < B * T; ++r) {
    const size_t t = r % T;
    const float* d = dqkv.data() + r * 3 * C;
    float* dx = dproj.data() + r * P;
    rope_turn(dx, d, table, t, heads, HS, -1.0f, true);  // q
    for (size_t g = 0; g < kv_heads; ++g) {
      // k: the group's gradients summed from zero in head order (repeat_kv_backward's sum),
      // then turned back.
      std::fill(dk.begin(), dk.end(), 0.0f);
      for (size_t h = g * group; h < (g + 1) * group; ++h) {
        const float* from = d + C + h * HS;
        for (size_t i = 0; i < HS; ++i) dk[i] += from[i];
      }
      rope_turn(dx + C + g * HS, dk.data(), table, t, 1, HS, -1.0f, true);
    }
    for (size_t h = 0; h < heads; ++h) {  // v, added in head order
      const float* from = d + 2 * C + h * HS;
      float* to = dx + C + KV + (h / group) * HS;
      for (size_t i = 0; i < HS; ++i) to[i] += from[i];
    }
  }
}

size_t head_cross_entropy_scratch_count(size_t V) { return 2 * kHeadBlockRows * V; }

float head_cross_entropy(std::span<float> dinp, std::span<float> dweight, std::span<float> scratch,
                         GemmOperand inp, std::span<const float> weight,
                         std::span<const int32_t> targets, size_t rows, size_t C, size_t V,
                         GemmCompute compute, float dloss) {
  const std::string shape = fmt::format("(rows={}, C={}, V={})", rows, C, V);
  nn_detail::check_optional_count("head_cross_entropy", "dinp", dinp, rows * C, shape);
  nn_detail::check_optional_count("head_cross_entropy", "dweight", dweight, V * C, shape);
  check_count("head_cross_entropy", "scratch", scratch, head_cross_entropy_scratch_count(V), shape);
  check_size("head_cross_entropy", "inp", inp.size(), rows * C, shape);
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
    const GemmOperand x = inp.is_bf16() ? GemmOperand(inp.bf16().subspan(r0 * C, n * C))
                                        : GemmOperand(inp.f32().subspan(r0 * C, n * C));
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
