// The gpt units: embedding, pre-LN transformer block, final LayerNorm + head + loss.
#include "models/gpt.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "models/unit_base.h"
#include "nn/attention.h"
#include "nn/layers.h"

namespace zerodp {

using models_detail::attention_backward_from;
using models_detail::attention_into;
using models_detail::Carver;
using models_detail::ParamUnit;
using models_detail::ProductInput;
using models_detail::Slot;

namespace {

constexpr float kInitStd = 0.02f;
// Linear weights: read only by matrix products (see TensorUse).
constexpr TensorUse kProduct = TensorUse::kProductOperand;

size_t rows_of(const BatchShape& s) { return static_cast<size_t>(s.B) * static_cast<size_t>(s.T); }

void zero(std::span<float> x) { std::fill(x.begin(), x.end(), 0.0f); }

// Every gpt unit sees the same (B, T); T is bounded by the position table.
class GptUnit : public ParamUnit {
 protected:
  GptUnit(std::string name, const GptConfig& config)
      : ParamUnit(std::move(name)),
        C_(static_cast<size_t>(config.embd)),
        NH_(static_cast<size_t>(config.heads)),
        V_(static_cast<size_t>(config.vocab)),
        max_T_(config.seq_len) {}

  void check_batch(std::string_view fn, const BatchShape& s) const {
    if (s.B < 1 || s.T < 1 || s.T > max_T_) {
      throw InvalidArgument(fmt::format(
          "unit {} {}: micro-batch (B={}, T={}) does not fit; need B >= 1 and 1 <= T <= "
          "seq_len={}",
          name(), fn, s.B, s.T, max_T_));
    }
  }

  size_t C_;   // channels
  size_t NH_;  // heads
  size_t V_;   // vocabulary
  int max_T_;  // seq_len
};

// ---------------------------------------------------------------- embedding

class EmbeddingUnit final : public GptUnit {
 public:
  explicit EmbeddingUnit(const GptConfig& config) : GptUnit("embedding", config) {
    const int64_t V = config.vocab, T = config.seq_len, C = config.embd;
    wte_ = param("wte.weight", {V, C}, InitKind::kNormal, kInitStd, true);
    wpe_ = param("wpe.weight", {T, C}, InitKind::kNormal, kInitStd, true);
  }

  size_t input_count(const BatchShape&) const override { return 0; }
  size_t output_count(const BatchShape& s) const override { return rows_of(s) * C_; }
  size_t saved_count(const BatchShape&, GemmCompute) const override { return 0; }
  size_t scratch_count(const BatchShape&) const override { return 0; }

 private:
  void do_forward(std::span<const float> w, GemmCompute, std::span<const float>,
                  std::span<float> out, std::span<float>, std::span<float>,
                  const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("forward", s);
    encoder_forward(out, mb.tokens, wte_.of(w), wpe_.of(w), s.B, s.T, C_, V_);
  }

  void do_backward(std::span<const float>, GemmCompute, std::span<const float>,
                   std::span<const float>, std::span<const float> dout, std::span<float> dw,
                   std::span<float>, std::span<float>, const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("backward", s);
    encoder_backward(wte_.of(dw), wpe_.of(dw), dout, mb.tokens, s.B, s.T, C_, V_);
  }

  Slot wte_, wpe_;
};

// ---------------------------------------------------------------- transformer block

// What the block's forward keeps for backward, in this order. `in` (the residual stream
// entering the block) is not here: the engine keeps it. Under kBF16 what only products read
// (ln1, qkv, attention's output, ln2, GELU's output) is kept in bf16, written so by the layer
// that produces it: every product rounded those to bf16 anyway, so the results are the same
// bits, no product rounds them again, and the block keeps 10C + 4 floats per row, not 15C + 4.
template <typename T>
struct BlockSaved {
  ProductInput<T> ln1;              // (rows, C) c_attn's input
  std::span<T> ln1_mean, ln1_rstd;  // (rows), (rows)
  ProductInput<T> qkv;              // (rows, 3C) c_attn's output, attention's input
  std::span<T> att;                 // (attention_saved_count)
  ProductInput<T> atty;             // (rows, C) attention output, c_proj's input
  std::span<T> res2;                // (rows, C) in + attn branch
  ProductInput<T> ln2;              // (rows, C) c_fc's input
  std::span<T> ln2_mean, ln2_rstd;  // (rows), (rows)
  std::span<T> fch;                 // (rows, 4C) c_fc output, GELU's input
  ProductInput<T> fch_gelu;         // (rows, 4C) GELU output, c_proj's input

  static size_t count(size_t rows, size_t C, const AttentionDims& d, GemmCompute compute) {
    const bool b16 = compute == GemmCompute::kBF16;
    const auto product_input = [&](size_t n) { return ProductInput<T>::floats(n, b16); };
    return product_input(rows * C) + 2 * rows + product_input(rows * 3 * C) +
           attention_saved_count(d) + product_input(rows * C) + rows * C + product_input(rows * C) +
           2 * rows + rows * 4 * C + product_input(rows * 4 * C);
  }
  static BlockSaved carve(std::span<T> buffer, size_t rows, size_t C, const AttentionDims& d,
                          GemmCompute compute) {
    const bool b16 = compute == GemmCompute::kBF16;
    Carver<T> c(buffer);
    BlockSaved k;
    k.ln1 = c.take_product_input(rows * C, b16);
    k.ln1_mean = c.take(rows);
    k.ln1_rstd = c.take(rows);
    k.qkv = c.take_product_input(rows * 3 * C, b16);
    k.att = c.take(attention_saved_count(d));
    k.atty = c.take_product_input(rows * C, b16);
    k.res2 = c.take(rows * C);
    k.ln2 = c.take_product_input(rows * C, b16);
    k.ln2_mean = c.take(rows);
    k.ln2_rstd = c.take(rows);
    k.fch = c.take(rows * 4 * C);
    k.fch_gelu = c.take_product_input(rows * 4 * C, b16);
    return k;
  }
};

class BlockUnit final : public GptUnit {
 public:
  BlockUnit(int index, const GptConfig& config) : GptUnit(fmt::format("h.{}", index), config) {
    const int64_t C = config.embd;
    // Residual projections: std scaled by 1/sqrt(2 * layers) (GPT-2; the peer does this).
    const float proj_std =
        static_cast<float>(kInitStd / std::sqrt(2.0 * static_cast<double>(config.layers)));
    const std::string p = name() + ".";
    ln1_w_ = param(p + "ln_1.weight", {C}, InitKind::kOnes, 0.0f, false);
    ln1_b_ = param(p + "ln_1.bias", {C}, InitKind::kZeros, 0.0f, false);
    attn_w_ =
        param(p + "attn.c_attn.weight", {3 * C, C}, InitKind::kNormal, kInitStd, true, kProduct);
    attn_b_ = param(p + "attn.c_attn.bias", {3 * C}, InitKind::kZeros, 0.0f, false);
    attnproj_w_ =
        param(p + "attn.c_proj.weight", {C, C}, InitKind::kNormal, proj_std, true, kProduct);
    attnproj_b_ = param(p + "attn.c_proj.bias", {C}, InitKind::kZeros, 0.0f, false);
    ln2_w_ = param(p + "ln_2.weight", {C}, InitKind::kOnes, 0.0f, false);
    ln2_b_ = param(p + "ln_2.bias", {C}, InitKind::kZeros, 0.0f, false);
    fc_w_ = param(p + "mlp.c_fc.weight", {4 * C, C}, InitKind::kNormal, kInitStd, true, kProduct);
    fc_b_ = param(p + "mlp.c_fc.bias", {4 * C}, InitKind::kZeros, 0.0f, false);
    fcproj_w_ =
        param(p + "mlp.c_proj.weight", {C, 4 * C}, InitKind::kNormal, proj_std, true, kProduct);
    fcproj_b_ = param(p + "mlp.c_proj.bias", {C}, InitKind::kZeros, 0.0f, false);
  }

  size_t input_count(const BatchShape& s) const override { return rows_of(s) * C_; }
  size_t output_count(const BatchShape& s) const override { return rows_of(s) * C_; }
  size_t saved_count(const BatchShape& s, GemmCompute compute) const override {
    return BlockSaved<float>::count(rows_of(s), C_, dims(s), compute);
  }
  // As do_forward and do_backward call them: c_attn, attention, c_proj, c_fc, mlp c_proj.
  std::vector<GemmShape> products(const BatchShape& s) const override {
    const size_t rows = rows_of(s), C = C_;
    std::vector<GemmShape> p;
    for (const auto& [in, out] : {std::pair{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}) {
      const auto l = linear_products(rows, in, out, true);
      p.insert(p.end(), l.begin(), l.end());
    }
    const auto a = attention_products(dims(s));
    p.insert(p.end(), a.begin(), a.end());
    return p;
  }
  // Forward: the branch output before the residual add (rows, C), then attention's workspace.
  // Backward: see do_backward().
  size_t scratch_count(const BatchShape& s) const override {
    return rows_of(s) * 9 * C_ + attention_scratch_count(dims(s));
  }

 private:
  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float> saved, std::span<float> scratch,
                  const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("forward", s);
    const size_t rows = rows_of(s), C = C_;
    const AttentionDims d = dims(s);
    const auto k = BlockSaved<float>::carve(saved, rows, C, d, compute);
    const auto branch = scratch.first(rows * C);  // (rows, C)
    const auto att_scratch = scratch.subspan(rows * C, attention_scratch_count(d));

    // x = in + c_proj(attention(c_attn(ln_1(in))))
    layernorm_forward(k.ln1.result(), k.ln1_mean, k.ln1_rstd, in, ln1_w_.of(w), ln1_b_.of(w), rows,
                      C);
    linear_forward(k.qkv.result(), k.ln1.operand(), attn_w_.of(w), attn_b_.of(w), rows, C, 3 * C,
                   compute);
    attention_into(k.atty, k.att, att_scratch, k.qkv, d, compute);
    linear_forward(branch, k.atty.operand(), attnproj_w_.of(w), attnproj_b_.of(w), rows, C, C,
                   compute);
    residual_forward(k.res2, in, branch);
    // out = x + c_proj(gelu(c_fc(ln_2(x))))
    layernorm_forward(k.ln2.result(), k.ln2_mean, k.ln2_rstd, k.res2, ln2_w_.of(w), ln2_b_.of(w),
                      rows, C);
    linear_forward(k.fch, k.ln2.operand(), fc_w_.of(w), fc_b_.of(w), rows, C, 4 * C, compute);
    gelu_forward(k.fch_gelu.result(), k.fch);
    linear_forward(branch, k.fch_gelu.operand(), fcproj_w_.of(w), fcproj_b_.of(w), rows, 4 * C, C,
                   compute);
    residual_forward(out, k.res2, branch);
  }

  // Scratch: dres2 (rows, C) lives throughout; two (rows, 4C) regions hold the MLP's
  // gradients and are reused for the attention branch once those are consumed; then the
  // attention layer's own workspace.
  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                   std::span<const float> saved, std::span<const float> dout, std::span<float> dw,
                   std::span<float> din, std::span<float> scratch, const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("backward", s);
    const size_t rows = rows_of(s), C = C_;
    const AttentionDims d = dims(s);
    const auto k = BlockSaved<const float>::carve(saved, rows, C, d, compute);
    Carver<float> c(scratch);
    const auto dres2 = c.take(rows * C);  // d(loss)/d(res2)
    const auto region_a = c.take(rows * 4 * C);
    const auto region_b = c.take(rows * 4 * C);
    const auto att_scratch = c.take(attention_scratch_count(d));

    // MLP branch. out = res2 + c_proj(gelu(c_fc(ln_2(res2)))): d(branch) = dout.
    std::copy(dout.begin(), dout.end(), dres2.begin());
    const auto dfch_gelu = region_a;  // (rows, 4C)
    linear_backward(dfch_gelu, fcproj_w_.of(dw), fcproj_b_.of(dw), dout, k.fch_gelu.operand(),
                    fcproj_w_.of(w), rows, 4 * C, C, compute, InputGrad::kOverwrite);
    const auto dln2 = region_a.first(rows * C);  // dfch_gelu is consumed by the time it is written
    if (compute == GemmCompute::kBF16) {
      // c_fc's products read their output gradient in bf16 anyway: GELU's backward writes it
      // rounded, into region_b's storage (only ever read as bf16 until region_b is reused
      // below), and sums c_fc's bias gradient from the fp32 values on the way.
      const std::span<BFloat16> dfch16(reinterpret_cast<BFloat16*>(region_b.data()), rows * 4 * C);
      gelu_backward_bf16(dfch16, fc_b_.of(dw), k.fch, dfch_gelu, rows, 4 * C);
      linear_backward(dln2, fc_w_.of(dw), {}, dfch16, k.ln2.operand(), fc_w_.of(w), rows, C, 4 * C,
                      compute, InputGrad::kOverwrite);
    } else {
      const auto dfch = region_b;  // (rows, 4C)
      gelu_backward(dfch, k.fch, dfch_gelu, InputGrad::kOverwrite);
      linear_backward(dln2, fc_w_.of(dw), fc_b_.of(dw), dfch, k.ln2.operand(), fc_w_.of(w), rows, C,
                      4 * C, compute, InputGrad::kOverwrite);
    }
    layernorm_backward(dres2, ln2_w_.of(dw), ln2_b_.of(dw), dln2, k.res2, ln2_w_.of(w), k.ln2_mean,
                       k.ln2_rstd, rows, C);

    // Attention branch. res2 = in + c_proj(atty): d(in) += dres2, d(branch) = dres2.
    for (size_t i = 0; i < din.size(); ++i) din[i] += dres2[i];
    const auto datty = region_b.first(rows * C);  // dfch is consumed
    linear_backward(datty, attnproj_w_.of(dw), attnproj_b_.of(dw), dres2, k.atty.operand(),
                    attnproj_w_.of(w), rows, C, C, compute, InputGrad::kOverwrite);
    const auto dqkv = region_b.subspan(rows * C, rows * 3 * C);
    zero(dqkv);
    attention_backward_from(dqkv, att_scratch, datty, k.qkv, k.att, d, compute);
    const auto dln1 = region_a.first(rows * C);  // dln2 is consumed
    linear_backward(dln1, attn_w_.of(dw), attn_b_.of(dw), dqkv, k.ln1.operand(), attn_w_.of(w),
                    rows, C, 3 * C, compute, InputGrad::kOverwrite);
    layernorm_backward(din, ln1_w_.of(dw), ln1_b_.of(dw), dln1, in, ln1_w_.of(w), k.ln1_mean,
                       k.ln1_rstd, rows, C);
  }

  AttentionDims dims(const BatchShape& s) const {
    return AttentionDims{
        .B = static_cast<size_t>(s.B), .T = static_cast<size_t>(s.T), .C = C_, .NH = NH_};
  }

  Slot ln1_w_, ln1_b_, attn_w_, attn_b_, attnproj_w_, attnproj_b_;
  Slot ln2_w_, ln2_b_, fc_w_, fc_b_, fcproj_w_, fcproj_b_;
};

// ---------------------------------------------------------------- final norm + head + loss

template <typename T>
struct HeadSaved {
  ProductInput<T> lnf;              // (rows, C) lm_head's input, bf16 under kBF16
  std::span<T> lnf_mean, lnf_rstd;  // (rows), (rows)
  std::span<T> logits;              // (rows, V)

  static size_t count(size_t rows, size_t C, size_t V, GemmCompute compute) {
    return ProductInput<T>::floats(rows * C, compute == GemmCompute::kBF16) + rows * (2 + V);
  }
  static HeadSaved carve(std::span<T> buffer, size_t rows, size_t C, size_t V,
                         GemmCompute compute) {
    Carver<T> c(buffer);
    HeadSaved k;
    k.lnf = c.take_product_input(rows * C, compute == GemmCompute::kBF16);
    k.lnf_mean = c.take(rows);
    k.lnf_rstd = c.take(rows);
    k.logits = c.take(rows * V);
    return k;
  }
};

class HeadUnit final : public GptUnit {
 public:
  explicit HeadUnit(const GptConfig& config) : GptUnit("head", config) {
    const int64_t C = config.embd, V = config.vocab;
    lnf_w_ = param("ln_f.weight", {C}, InitKind::kOnes, 0.0f, false);
    lnf_b_ = param("ln_f.bias", {C}, InitKind::kZeros, 0.0f, false);
    lm_w_ = param("lm_head.weight", {V, C}, InitKind::kNormal, kInitStd, true, kProduct);
  }

  size_t input_count(const BatchShape& s) const override { return rows_of(s) * C_; }
  size_t output_count(const BatchShape&) const override { return 1; }
  size_t saved_count(const BatchShape& s, GemmCompute compute) const override {
    return HeadSaved<float>::count(rows_of(s), C_, V_, compute);
  }
  std::vector<GemmShape> products(const BatchShape& s) const override {
    return linear_products(rows_of(s), C_, V_, true);
  }
  // Backward: dlogits (rows, V) and dlnf (rows, C).
  size_t scratch_count(const BatchShape& s) const override { return rows_of(s) * (V_ + C_); }

 private:
  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float> saved, std::span<float>,
                  const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("forward", s);
    const size_t rows = rows_of(s);
    const auto k = HeadSaved<float>::carve(saved, rows, C_, V_, compute);
    layernorm_forward(k.lnf.result(), k.lnf_mean, k.lnf_rstd, in, lnf_w_.of(w), lnf_b_.of(w), rows,
                      C_);
    linear_forward(k.logits, k.lnf.operand(), lm_w_.of(w), {}, rows, C_, V_, compute);
    out[0] = cross_entropy_forward_backward({}, k.logits, mb.targets, rows, V_);
  }

  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                   std::span<const float> saved, std::span<const float>, std::span<float> dw,
                   std::span<float> din, std::span<float> scratch, const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("backward", s);
    const size_t rows = rows_of(s);
    const auto k = HeadSaved<const float>::carve(saved, rows, C_, V_, compute);
    Carver<float> c(scratch);
    const auto dlogits = c.take(rows * V_);
    const auto dlnf = c.take(rows * C_);
    zero(dlogits);
    // The loss is recomputed from the saved logits (one exp pass), and its gradient seeded
    // with loss_grad_scale.
    cross_entropy_forward_backward(dlogits, k.logits, mb.targets, rows, V_, mb.loss_grad_scale);
    linear_backward(dlnf, lm_w_.of(dw), {}, dlogits, k.lnf.operand(), lm_w_.of(w), rows, C_, V_,
                    compute, InputGrad::kOverwrite);
    layernorm_backward(din, lnf_w_.of(dw), lnf_b_.of(dw), dlnf, in, lnf_w_.of(w), k.lnf_mean,
                       k.lnf_rstd, rows, C_);
  }

  Slot lnf_w_, lnf_b_, lm_w_;
};

constexpr std::array<GptPreset, 4> kPresets{{
    {"tiny", {.layers = 2, .heads = 2, .embd = 32, .seq_len = 32}, 8},
    {"small", {.layers = 4, .heads = 4, .embd = 128, .seq_len = 64}, 16},
    {"medium", {.layers = 6, .heads = 6, .embd = 384, .seq_len = 128}, 8},
    {"large", {.layers = 12, .heads = 12, .embd = 768, .seq_len = 1024}, 4},
}};

}  // namespace

void validate(const GptConfig& config) {
  const auto positive = [](std::string_view field, int value) {
    if (value < 1) {
      throw InvalidArgument(fmt::format("gpt: {} is {}; it must be at least 1", field, value));
    }
  };
  positive("layers", config.layers);
  positive("heads", config.heads);
  positive("embd", config.embd);
  positive("seq_len", config.seq_len);
  positive("vocab", config.vocab);
  if (config.embd % config.heads != 0) {
    const int below = config.embd / config.heads * config.heads;
    throw InvalidArgument(fmt::format(
        "gpt: embd {} is not divisible by heads {}; use an embd that is a multiple of {} "
        "(e.g. {} or {}) or a heads that divides {}",
        config.embd, config.heads, config.heads, std::max(below, config.heads),
        below + config.heads, config.embd));
  }
}

std::span<const GptPreset> gpt_presets() { return kPresets; }

const GptPreset& gpt_preset(std::string_view name) {
  for (const GptPreset& p : kPresets) {
    if (p.name == name) return p;
  }
  throw InvalidArgument(
      fmt::format("gpt: unknown size \"{}\"; known sizes are tiny, small, medium, large", name));
}

Model make_gpt(const GptConfig& config) {
  validate(config);
  Model model;
  model.push_back(std::make_unique<EmbeddingUnit>(config));
  for (int i = 0; i < config.layers; ++i) model.push_back(std::make_unique<BlockUnit>(i, config));
  model.push_back(std::make_unique<HeadUnit>(config));
  return model;
}

}  // namespace zerodp
