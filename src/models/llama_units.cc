// The llama units (models/llama.h): embedding, pre-norm block (RMSNorm, rotary grouped-query
// attention, SwiGLU), final RMSNorm + head + loss; and llama_logits, the same forward without
// the loss.
//
// Decisions a reader could not guess from the interface:
//
// * The head recomputes its logits in backward. Its forward is head_cross_entropy with no
//   gradients (the loss alone, 64 rows of logits at a time in scratch); its backward calls
//   head_cross_entropy again with the gradients, which multiplies the logits a second time:
//   one more (rows, C) x (C, V) product per step, +1/3 of the head's FLOPs (its forward,
//   input-gradient and weight-gradient products are three of equal size). In exchange the
//   logits are never held whole, neither in saved state nor in scratch (rows x V floats: 2 GiB
//   for 8 x 1,024 rows at V = 32,768 against 2 x 64 x V floats of the blocks), and the head
//   needs no engine hook: forward and backward are the Unit contract's two calls, and what the
//   head saves is the normed rows and their 1/rms.
// * q, k and v are consecutive in the block's flat buffer, so their weights are one
//   ((C + 2 KV hs), C) matrix and one product; gate and up likewise one (2F, C) product. The
//   product's (rows, C + 2 KV hs) output is scratch: rope_qkv_forward turns q and k and lays out
//   attention's packed (rows, 3C) input, k and v repeated to each query head of their group,
//   and its backward (a linear map) needs nothing of it.
// * The bf16 pipeline (docs/architecture.md, "Compute precision"), as the gpt's: under kBF16
//   what only products read is kept in bf16, written rounded by the layer that produces it:
//   both RMSNorm outputs of a block and the head's, attention's packed qkv and its output, and
//   SwiGLU's output. Kept in fp32: the residual stream res2 (RMSNorm's input), gate_up
//   (SwiGLU's input: rounding it would change SwiGLU's result), the 1/rms values, attention's
//   own saved state, and every gradient (a Linear's output gradient is rounded once per backward
//   by linear_backward's scope).
// * Weights the units read only through gemm() (every Linear weight and lm_head, via
//   linear_forward/backward and head_cross_entropy) are TensorUse::kProductOperand; the
//   embedding (read by rows) and the RMSNorm weights (elementwise) are not.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "models/llama.h"
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

// Every Linear weight and the embedding: N(0, 0.02), no scaled residual init (issue 48).
constexpr float kInitStd = 0.02f;
constexpr TensorUse kProduct = TensorUse::kProductOperand;

size_t rows_of(const BatchShape& s) { return static_cast<size_t>(s.B) * static_cast<size_t>(s.T); }

void zero(std::span<float> x) { std::fill(x.begin(), x.end(), 0.0f); }

std::string batch_refusal(std::string_view who, const BatchShape& s, int max_T) {
  return fmt::format(
      "{}: micro-batch (B={}, T={}) does not fit; need B >= 1 and 1 <= T <= seq_len={}", who, s.B,
      s.T, max_T);
}

// Every llama unit sees the same (B, T); T is bounded by the rotary table.
class LlamaUnit : public ParamUnit {
 protected:
  LlamaUnit(std::string name, const LlamaConfig& c)
      : ParamUnit(std::move(name)),
        C_(static_cast<size_t>(c.embd)),
        NH_(static_cast<size_t>(c.heads)),
        KV_(static_cast<size_t>(c.kv_heads)),
        HS_(static_cast<size_t>(c.head_size())),
        F_(static_cast<size_t>(c.ffn)),
        V_(static_cast<size_t>(c.vocab)),
        max_T_(c.seq_len),
        eps_(c.norm_eps) {}

  void check_batch(std::string_view fn, const BatchShape& s) const {
    if (s.B < 1 || s.T < 1 || s.T > max_T_) {
      throw InvalidArgument(batch_refusal(fmt::format("unit {} {}", name(), fn), s, max_T_));
    }
  }

  size_t C_;   // channels
  size_t NH_;  // query heads
  size_t KV_;  // key/value heads
  size_t HS_;  // head size
  size_t F_;   // SwiGLU's hidden units
  size_t V_;   // vocabulary
  int max_T_;  // seq_len
  float eps_;  // RMSNorm's
};

// ---------------------------------------------------------------- embedding

class EmbeddingUnit final : public LlamaUnit {
 public:
  explicit EmbeddingUnit(const LlamaConfig& c) : LlamaUnit("embedding", c) {
    wte_ = param("model.embed_tokens.weight", {c.vocab, c.embd}, InitKind::kNormal, kInitStd, true);
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
    embedding_forward(out, mb.tokens, wte_.of(w), static_cast<size_t>(s.B),
                      static_cast<size_t>(s.T), C_, V_);
  }

  void do_backward(std::span<const float>, GemmCompute, std::span<const float>,
                   std::span<const float>, std::span<const float> dout, std::span<float> dw,
                   std::span<float>, std::span<float>, const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("backward", s);
    embedding_backward(wte_.of(dw), dout, mb.tokens, static_cast<size_t>(s.B),
                       static_cast<size_t>(s.T), C_, V_);
  }

  Slot wte_;
};

// ---------------------------------------------------------------- transformer block

// What the block's forward keeps for backward, in this order. `in` (the residual stream
// entering the block) is not here: the engine keeps it. Per row, with P = C + 2 KV hs the
// q/k/v product's width: fp32 7C + 3F + 2 NH + 2 floats (x1 C, rstd1 1, qkv 3C, attention's
// 2 NH, atty C, res2 C, x2 C, rstd2 1, gate_up 2F, act F); under kBF16 x1, qkv, atty, x2 and
// act take half (ProductInput::floats rounds each buffer up to whole floats).
template <typename T>
struct BlockSaved {
  ProductInput<T> x1;    // (rows, C) input_layernorm's output, the q/k/v product's input
  std::span<T> rstd1;    // (rows)
  ProductInput<T> qkv;   // (rows, 3C) attention's packed input (rope_qkv_forward)
  std::span<T> att;      // (attention_saved_count) attention's own state
  ProductInput<T> atty;  // (rows, C) attention's output, o_proj's input
  std::span<T> res2;     // (rows, C) in + the attention branch
  ProductInput<T> x2;    // (rows, C) post_attention_layernorm's output, gate/up's input
  std::span<T> rstd2;    // (rows)
  std::span<T> gate_up;  // (rows, 2F) the gate/up product's output, SwiGLU's input (fp32)
  ProductInput<T> act;   // (rows, F) SwiGLU's output, down_proj's input

  static size_t count(size_t rows, size_t C, size_t F, const AttentionDims& d,
                      GemmCompute compute) {
    const bool b16 = compute == GemmCompute::kBF16;
    const auto product_input = [&](size_t n) { return ProductInput<T>::floats(n, b16); };
    return product_input(rows * C) + rows + product_input(rows * 3 * C) + attention_saved_count(d) +
           product_input(rows * C) + rows * C + product_input(rows * C) + rows + rows * 2 * F +
           product_input(rows * F);
  }
  static BlockSaved carve(std::span<T> buffer, size_t rows, size_t C, size_t F,
                          const AttentionDims& d, GemmCompute compute) {
    const bool b16 = compute == GemmCompute::kBF16;
    Carver<T> c(buffer);
    BlockSaved k;
    k.x1 = c.take_product_input(rows * C, b16);
    k.rstd1 = c.take(rows);
    k.qkv = c.take_product_input(rows * 3 * C, b16);
    k.att = c.take(attention_saved_count(d));
    k.atty = c.take_product_input(rows * C, b16);
    k.res2 = c.take(rows * C);
    k.x2 = c.take_product_input(rows * C, b16);
    k.rstd2 = c.take(rows);
    k.gate_up = c.take(rows * 2 * F);
    k.act = c.take_product_input(rows * F, b16);
    return k;
  }
};

class BlockUnit final : public LlamaUnit {
 public:
  BlockUnit(int index, const LlamaConfig& c)
      : LlamaUnit(fmt::format("h.{}", index), c),
        rope_(rope_table(static_cast<size_t>(c.seq_len), static_cast<size_t>(c.head_size()),
                         c.rope_theta)) {
    const int64_t C = c.embd, KV = static_cast<int64_t>(c.kv_heads) * c.head_size(), F = c.ffn;
    const std::string p = fmt::format("model.layers.{}.", index);
    const auto linear = [&](const std::string& name, int64_t out, int64_t in) {
      return param(p + name, {out, in}, InitKind::kNormal, kInitStd, true, kProduct);
    };
    norm1_ = param(p + "input_layernorm.weight", {C}, InitKind::kOnes, 0.0f, false);
    const Slot q = linear("self_attn.q_proj.weight", C, C);
    const Slot k = linear("self_attn.k_proj.weight", KV, C);
    const Slot v = linear("self_attn.v_proj.weight", KV, C);
    qkv_w_ = Slot{q.offset, q.numel + k.numel + v.numel};  // consecutive: one (P, C) matrix
    o_ = linear("self_attn.o_proj.weight", C, C);
    norm2_ = param(p + "post_attention_layernorm.weight", {C}, InitKind::kOnes, 0.0f, false);
    const Slot gate = linear("mlp.gate_proj.weight", F, C);
    const Slot up = linear("mlp.up_proj.weight", F, C);
    gate_up_w_ = Slot{gate.offset, gate.numel + up.numel};  // consecutive: one (2F, C) matrix
    down_ = linear("mlp.down_proj.weight", C, F);
  }

  size_t input_count(const BatchShape& s) const override { return rows_of(s) * C_; }
  size_t output_count(const BatchShape& s) const override { return rows_of(s) * C_; }
  size_t saved_count(const BatchShape& s, GemmCompute compute) const override {
    return BlockSaved<float>::count(rows_of(s), C_, F_, dims(s), compute);
  }
  // As do_forward and do_backward call them: q/k/v, attention, o_proj, gate/up, down_proj.
  std::vector<GemmShape> products(const BatchShape& s) const override {
    const size_t rows = rows_of(s), C = C_, F = F_;
    std::vector<GemmShape> p;
    for (const auto& [in, out] : {std::pair{C, P()}, {C, C}, {C, 2 * F}, {F, C}}) {
      const auto l = linear_products(rows, in, out, true);
      p.insert(p.end(), l.begin(), l.end());
    }
    const auto a = attention_products(dims(s));
    p.insert(p.end(), a.begin(), a.end());
    return p;
  }
  // Backward's, the larger: dres2 (rows, C), region A (rows, max(F, P)), region B
  // (rows, max(2F, 3C)), attention's workspace. Forward uses (rows, P) (the q/k/v product's
  // output, then the branches) and attention's workspace.
  size_t scratch_count(const BatchShape& s) const override {
    return rows_of(s) * (C_ + std::max(F_, P()) + std::max(2 * F_, 3 * C_)) +
           attention_scratch_count(dims(s));
  }

 private:
  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float> saved, std::span<float> scratch,
                  const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("forward", s);
    const size_t rows = rows_of(s), C = C_, F = F_, P = this->P();
    const AttentionDims d = dims(s);
    const auto k = BlockSaved<float>::carve(saved, rows, C, F, d, compute);
    Carver<float> c(scratch);
    const auto proj = c.take(rows * P);
    const auto att_scratch = c.take(attention_scratch_count(d));
    const auto branch = proj.first(rows * C);  // written once proj is consumed

    // res2 = in + o_proj(attention(rope_qkv(qkv_proj(rmsnorm(in)))))
    rmsnorm_forward(k.x1.result(), k.rstd1, in, norm1_.of(w), rows, C, eps_);
    linear_forward(proj, k.x1.operand(), qkv_w_.of(w), {}, rows, C, P, compute);
    rope_qkv_forward(k.qkv.result(), proj, rope_, d.B, d.T, NH_, KV_, HS_);
    attention_into(k.atty, k.att, att_scratch, k.qkv, d, compute);
    linear_forward(branch, k.atty.operand(), o_.of(w), {}, rows, C, C, compute);
    residual_forward(k.res2, in, branch);
    // out = res2 + down_proj(swiglu(gate_up_proj(rmsnorm(res2))))
    rmsnorm_forward(k.x2.result(), k.rstd2, k.res2, norm2_.of(w), rows, C, eps_);
    linear_forward(k.gate_up, k.x2.operand(), gate_up_w_.of(w), {}, rows, C, 2 * F, compute);
    swiglu_rows_forward(k.act.result(), k.gate_up, rows, F);
    linear_forward(branch, k.act.operand(), down_.of(w), {}, rows, F, C, compute);
    residual_forward(out, k.res2, branch);
  }

  // Scratch: dres2 lives throughout; regions A and B take each gradient in turn, each written
  // once the one it replaces is consumed: A dact, B dgate_up, A dx2, A datty, B dqkv, A dproj,
  // B dx1; then attention's workspace.
  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                   std::span<const float> saved, std::span<const float> dout, std::span<float> dw,
                   std::span<float> din, std::span<float> scratch, const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("backward", s);
    const size_t rows = rows_of(s), C = C_, F = F_, P = this->P();
    const AttentionDims d = dims(s);
    const auto k = BlockSaved<const float>::carve(saved, rows, C, F, d, compute);
    Carver<float> c(scratch);
    const auto dres2 = c.take(rows * C);  // d(loss)/d(res2)
    const auto region_a = c.take(rows * std::max(F, P));
    const auto region_b = c.take(rows * std::max(2 * F, 3 * C));
    const auto att_scratch = c.take(attention_scratch_count(d));

    // MLP branch: out = res2 + down(act), so d(branch) = dout.
    std::copy(dout.begin(), dout.end(), dres2.begin());
    const auto dact = region_a.first(rows * F);
    linear_backward(dact, down_.of(dw), {}, dout, k.act.operand(), down_.of(w), rows, F, C, compute,
                    InputGrad::kOverwrite);
    const auto dgate_up = region_b.first(rows * 2 * F);
    swiglu_rows_backward(dgate_up, dact, k.gate_up, rows, F, InputGrad::kOverwrite);
    const auto dx2 = region_a.first(rows * C);
    linear_backward(dx2, gate_up_w_.of(dw), {}, dgate_up, k.x2.operand(), gate_up_w_.of(w), rows, C,
                    2 * F, compute, InputGrad::kOverwrite);
    rmsnorm_backward(dres2, norm2_.of(dw), dx2, k.res2, norm2_.of(w), k.rstd2, rows, C);

    // Attention branch: res2 = in + o_proj(atty): d(in) += dres2, d(branch) = dres2.
    for (size_t i = 0; i < din.size(); ++i) din[i] += dres2[i];
    const auto datty = region_a.first(rows * C);
    linear_backward(datty, o_.of(dw), {}, dres2, k.atty.operand(), o_.of(w), rows, C, C, compute,
                    InputGrad::kOverwrite);
    const auto dqkv = region_b.first(rows * 3 * C);
    zero(dqkv);
    attention_backward_from(dqkv, att_scratch, datty, k.qkv, k.att, d, compute);
    const auto dproj = region_a.first(rows * P);
    zero(dproj);
    rope_qkv_backward(dproj, dqkv, rope_, d.B, d.T, NH_, KV_, HS_);
    const auto dx1 = region_b.first(rows * C);
    linear_backward(dx1, qkv_w_.of(dw), {}, dproj, k.x1.operand(), qkv_w_.of(w), rows, C, P,
                    compute, InputGrad::kOverwrite);
    rmsnorm_backward(din, norm1_.of(dw), dx1, in, norm1_.of(w), k.rstd1, rows, C);
  }

  size_t P() const { return C_ + 2 * KV_ * HS_; }  // the q/k/v product's width
  AttentionDims dims(const BatchShape& s) const {
    return AttentionDims{
        .B = static_cast<size_t>(s.B), .T = static_cast<size_t>(s.T), .C = C_, .NH = NH_};
  }

  RopeTable rope_;  // (seq_len, hs / 2), built once
  Slot norm1_, qkv_w_, o_, norm2_, gate_up_w_, down_;
};

// ---------------------------------------------------------------- final norm + head + loss

// The normed rows (lm_head's input; bf16 under kBF16) and their 1/rms: C + 1 floats per row
// in fp32, C/2 + 1 under kBF16.
template <typename T>
struct HeadSaved {
  ProductInput<T> xn;  // (rows, C)
  std::span<T> rstd;   // (rows)

  static size_t count(size_t rows, size_t C, GemmCompute compute) {
    return ProductInput<T>::floats(rows * C, compute == GemmCompute::kBF16) + rows;
  }
  static HeadSaved carve(std::span<T> buffer, size_t rows, size_t C, GemmCompute compute) {
    Carver<T> c(buffer);
    HeadSaved k;
    k.xn = c.take_product_input(rows * C, compute == GemmCompute::kBF16);
    k.rstd = c.take(rows);
    return k;
  }
};

class HeadUnit final : public LlamaUnit {
 public:
  explicit HeadUnit(const LlamaConfig& c) : LlamaUnit("head", c) {
    norm_ = param("model.norm.weight", {c.embd}, InitKind::kOnes, 0.0f, false);
    lm_ = param("lm_head.weight", {c.vocab, c.embd}, InitKind::kNormal, kInitStd, true, kProduct);
  }

  size_t input_count(const BatchShape& s) const override { return rows_of(s) * C_; }
  size_t output_count(const BatchShape&) const override { return 1; }
  size_t saved_count(const BatchShape& s, GemmCompute compute) const override {
    return HeadSaved<float>::count(rows_of(s), C_, compute);
  }
  // head_cross_entropy's, per block of kHeadBlockRows rows and the shorter last one: the
  // logits' product in forward, and in backward again with the two gradient products. A block
  // whose targets are all ignored makes none of them (it adds nothing to the loss).
  std::vector<GemmShape> products(const BatchShape& s) const override {
    const size_t rows = rows_of(s);
    std::vector<GemmShape> p;
    for (const size_t n : {rows >= kHeadBlockRows ? kHeadBlockRows : 0, rows % kHeadBlockRows}) {
      if (n == 0) continue;
      const auto l = linear_products(n, C_, V_, true);
      p.insert(p.end(), l.begin(), l.end());
    }
    return p;
  }
  // Backward's, the larger: dxn (rows, C) and head_cross_entropy's blocks; forward uses the
  // blocks alone.
  size_t scratch_count(const BatchShape& s) const override {
    return rows_of(s) * C_ + head_cross_entropy_scratch_count(V_);
  }

 private:
  void do_forward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                  std::span<float> out, std::span<float> saved, std::span<float> scratch,
                  const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("forward", s);
    const size_t rows = rows_of(s);
    const auto k = HeadSaved<float>::carve(saved, rows, C_, compute);
    rmsnorm_forward(k.xn.result(), k.rstd, in, norm_.of(w), rows, C_, eps_);
    out[0] = head_cross_entropy({}, {}, scratch.first(head_cross_entropy_scratch_count(V_)),
                                k.xn.operand(), lm_.of(w), mb.targets, rows, C_, V_, compute);
  }

  // The logits are recomputed (see the top of the file), block by block, with their gradient
  // seeded with loss_grad_scale.
  void do_backward(std::span<const float> w, GemmCompute compute, std::span<const float> in,
                   std::span<const float> saved, std::span<const float>, std::span<float> dw,
                   std::span<float> din, std::span<float> scratch, const MicroBatch& mb) override {
    const BatchShape& s = mb.shape;
    check_batch("backward", s);
    const size_t rows = rows_of(s);
    const auto k = HeadSaved<const float>::carve(saved, rows, C_, compute);
    Carver<float> c(scratch);
    const auto dxn = c.take(rows * C_);
    const auto blocks = c.take(head_cross_entropy_scratch_count(V_));
    zero(dxn);
    (void)head_cross_entropy(dxn, lm_.of(dw), blocks, k.xn.operand(), lm_.of(w), mb.targets, rows,
                             C_, V_, compute, mb.loss_grad_scale);
    rmsnorm_backward(din, norm_.of(dw), dxn, in, norm_.of(w), k.rstd, rows, C_);
  }

  Slot norm_, lm_;
};

}  // namespace

Model make_llama(const LlamaConfig& config) {
  validate(config);
  Model model;
  model.push_back(std::make_unique<EmbeddingUnit>(config));
  for (int i = 0; i < config.layers; ++i) model.push_back(std::make_unique<BlockUnit>(i, config));
  model.push_back(std::make_unique<HeadUnit>(config));
  return model;
}

std::vector<float> llama_logits(const LlamaConfig& config,
                                std::span<const std::vector<float>> weights,
                                std::span<const int32_t> tokens, int B, int T) {
  const Model model = make_llama(config);
  const BatchShape s{.B = B, .T = T};
  if (B < 1 || T < 1 || T > config.seq_len) {
    throw InvalidArgument(batch_refusal("llama_logits", s, config.seq_len));
  }
  const size_t n = model.size();
  if (weights.size() != n) {
    throw InvalidArgument(
        fmt::format("llama_logits: the model has {} units; got {} weight buffers (one per unit)", n,
                    weights.size()));
  }
  for (size_t u = 0; u < n; ++u) {
    if (weights[u].size() != model[u]->numel()) {
      throw InvalidArgument(
          fmt::format("llama_logits: unit {} has {} parameters; its weights hold {}",
                      model[u]->name(), model[u]->numel(), weights[u].size()));
    }
  }
  MicroBatch mb;
  mb.shape = s;
  mb.tokens = tokens;  // the embedding checks its length and range
  // The embedding and the blocks, in fp32, each unit's output the next one's input.
  std::vector<float> act, next, saved, scratch;
  for (size_t u = 0; u + 1 < n; ++u) {
    next.resize(model[u]->output_count(s));
    saved.resize(model[u]->saved_count(s, GemmCompute::kFP32));
    scratch.resize(std::max(scratch.size(), model[u]->scratch_count(s)));
    model[u]->forward(UnitWeights::fp32(weights[u]), act, next, saved, scratch, mb);
    std::swap(act, next);
  }
  // The head's final RMSNorm and product, every row at once.
  const std::vector<TensorSpec>& head = model.back()->tensors();
  const std::span<const float> head_w(weights[n - 1]);
  const auto C = static_cast<size_t>(config.embd), V = static_cast<size_t>(config.vocab);
  const size_t rows = rows_of(s);
  std::vector<float> xn(rows * C), rstd(rows), logits(rows * V);
  rmsnorm_forward(xn, rstd, act, head_w.subspan(head[0].offset, head[0].numel), rows, C,
                  config.norm_eps);
  linear_forward(logits, xn, head_w.subspan(head[1].offset, head[1].numel), {}, rows, C, V,
                 GemmCompute::kFP32);
  return logits;
}

}  // namespace zerodp
