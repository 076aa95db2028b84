// The llama family: the presets and the FFN rule as documented, TinyLlama's published
// parameter count for the 1.1b preset, and every refusal naming the field; then the model's
// units: parameter counts against llama_parameter_count, Hugging Face's tensor names and
// shapes, whole-model gradients against finite differences (grouped, one kv head per query
// head, one kv head for all), the loss at init, the TensorUse claims, bf16 products against
// fp32, llama_logits against the head's loss, and causality.
#include "models/llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "model_testing.h"
#include "models/gpt.h"
#include "models/init.h"
#include "models/model.h"
#include "nn/layers.h"
#include "tensor/dtype.h"

namespace zerodp {
namespace {

using model_testing::Buffers;
using model_testing::random_weights;
using model_testing::zero_grads;

std::string refusal(const LlamaConfig& c) {
  try {
    validate(c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Llama, TheFfnRuleIsLlamasTruncateThenRoundUp) {
  EXPECT_EQ(llama_ffn_hidden(32, 64), 128);
  EXPECT_EQ(llama_ffn_hidden(128, 64), 384);
  EXPECT_EQ(llama_ffn_hidden(384, 64), 1024);
  EXPECT_EQ(llama_ffn_hidden(768, 256), 2048);
  EXPECT_EQ(llama_ffn_hidden(2048, 256), 5632);
  EXPECT_EQ(llama_ffn_hidden(4096, 256), 11008);  // Llama-2 7B's
  EXPECT_EQ(llama_ffn_multiple(384), 64);
  EXPECT_EQ(llama_ffn_multiple(385), 256);
  EXPECT_THROW(llama_ffn_hidden(0, 64), InvalidArgument);
}

TEST(Llama, EveryPresetIsValidAndItsFfnIsTheRules) {
  for (const LlamaPreset& p : llama_presets()) {
    EXPECT_NO_THROW(validate(p.config)) << p.name;
    EXPECT_EQ(p.config.ffn, llama_ffn_hidden(p.config.embd, llama_ffn_multiple(p.config.embd)))
        << p.name;
    EXPECT_GT(p.micro_batch, 0) << p.name;
  }
  EXPECT_EQ(llama_preset("tiny").config.vocab, 256);
  EXPECT_THROW(llama_preset("huge"), InvalidArgument);
}

// TinyLlama-1.1B: 22 layers, 2048 wide, 32 heads, 4 KV heads, FFN 5632, vocab 32000, an
// untied head.
TEST(Llama, TheOnePointOneBPresetHasTinyLlamasParameterCount) {
  const LlamaConfig& c = llama_preset("1.1b").config;
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_EQ(llama_parameter_count(c), 1100048384u);
  // tiny by hand: embedding and head 2 x 256 x 32, per block 2 x 32 + 2 x 32 x 32 +
  // 2 x 32 x 16 + 3 x 32 x 128, and the final norm.
  EXPECT_EQ(llama_parameter_count(llama_preset("tiny").config),
            2u * 256 * 32 + 2u * (2 * 32 + 2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 128) + 32);
}

TEST(Llama, RefusalsNameTheFieldAndWhatWouldWork) {
  LlamaConfig c;
  c.kv_heads = 3;
  EXPECT_NE(refusal(c).find("kv_heads 3 does not divide heads 4"), std::string::npos) << refusal(c);
  c = {};
  c.heads = 3;
  EXPECT_NE(refusal(c).find("heads 3 does not divide embd 128"), std::string::npos);
  c = {};
  c.embd = 12;
  c.heads = 4;
  c.kv_heads = 2;
  EXPECT_NE(refusal(c).find("head size embd / heads = 12 / 4 = 3 is odd"), std::string::npos);
  c = {};
  c.rope_theta = 1.0f;
  EXPECT_NE(refusal(c).find("rope_theta is 1"), std::string::npos);
  c = {};
  c.norm_eps = 0;
  EXPECT_NE(refusal(c).find("norm_eps is 0"), std::string::npos);
  c = {};
  c.vocab = 1;
  EXPECT_NE(refusal(c).find("vocab is 1"), std::string::npos);
  c = {};
  c.layers = 0;
  EXPECT_NE(refusal(c).find("layers is 0"), std::string::npos);
  EXPECT_EQ(refusal(LlamaConfig{}), "");
}

// ---------------------------------------------------------------- the model's units

// parameter_count(make_llama) is the formula for every preset, 1.1b included (specs only: no
// weights are allocated).
TEST(LlamaModel, EveryPresetsUnitsHoldLlamaParameterCount) {
  for (const LlamaPreset& p : llama_presets()) {
    EXPECT_EQ(parameter_count(make_llama(p.config)), llama_parameter_count(p.config)) << p.name;
  }
  EXPECT_EQ(parameter_count(make_llama(llama_preset("1.1b").config)), 1100048384u);
  EXPECT_THROW(make_llama(LlamaConfig{.kv_heads = 3}), InvalidArgument);
}

// Hugging Face's Llama state_dict names and shapes, in each unit's buffer order.
TEST(LlamaModel, NamesAndShapesAreHuggingFaces) {
  const LlamaConfig c{
      .layers = 2, .heads = 4, .kv_heads = 2, .embd = 16, .ffn = 24, .seq_len = 8, .vocab = 11};
  const Model m = make_llama(c);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]->name(), "embedding");
  EXPECT_EQ(m[1]->name(), "h.0");
  EXPECT_EQ(m[2]->name(), "h.1");
  EXPECT_EQ(m[3]->name(), "head");
  std::vector<std::pair<std::string, std::vector<int64_t>>> got;
  for (const auto& u : m) {
    for (const TensorSpec& t : u->tensors()) got.emplace_back(t.name, t.shape);
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {
      {"model.embed_tokens.weight", {11, 16}}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    want.push_back({p + "input_layernorm.weight", {16}});
    want.push_back({p + "self_attn.q_proj.weight", {16, 16}});
    want.push_back({p + "self_attn.k_proj.weight", {8, 16}});
    want.push_back({p + "self_attn.v_proj.weight", {8, 16}});
    want.push_back({p + "self_attn.o_proj.weight", {16, 16}});
    want.push_back({p + "post_attention_layernorm.weight", {16}});
    want.push_back({p + "mlp.gate_proj.weight", {24, 16}});
    want.push_back({p + "mlp.up_proj.weight", {24, 16}});
    want.push_back({p + "mlp.down_proj.weight", {16, 24}});
  }
  want.push_back({"model.norm.weight", {16}});
  want.push_back({"lm_head.weight", {11, 16}});
  EXPECT_EQ(got, want);
}

// Offsets back to back; norms ones with no decay; every matrix N(0, 0.02) with decay; every
// Linear weight and lm_head a product operand, the embedding and the norms not.
TEST(LlamaModel, OffsetsContiguousAndPolicyAsSpecified) {
  for (const LlamaPreset& p : llama_presets()) {
    const Model m = make_llama(p.config);
    std::set<std::string> names;
    for (const auto& u : m) {
      size_t offset = 0;
      for (const TensorSpec& t : u->tensors()) {
        SCOPED_TRACE(std::string(p.name) + " " + t.name);
        EXPECT_TRUE(names.insert(t.name).second) << "duplicate name";
        EXPECT_EQ(t.offset, offset);
        offset += t.numel;
        const bool norm = t.name.find("norm") != std::string::npos;
        const bool embedding = t.name == "model.embed_tokens.weight";
        EXPECT_EQ(t.weight_decay, !norm);
        EXPECT_EQ(t.init, norm ? InitKind::kOnes : InitKind::kNormal);
        if (!norm) {
          EXPECT_FLOAT_EQ(t.init_std, 0.02f);
        }
        EXPECT_EQ(t.use, norm || embedding ? TensorUse::kAny : TensorUse::kProductOperand);
      }
      EXPECT_EQ(offset, u->numel()) << u->name();
    }
  }
}

// B=2 sequences of T=5 tokens over a vocabulary of 11, 2 layers, 4 heads, C 16 (head size 4),
// SwiGLU 24 wide, seq_len 8 (T below it).
struct TinyLlama {
  LlamaConfig config;
  Model model;
  std::vector<int32_t> tokens = {3, 10, 7, 7, 1, 0, 2, 9, 3, 8};
  std::vector<int32_t> targets = {10, 7, 7, 1, 0, 2, 9, 3, 8, 5};
  explicit TinyLlama(int kv_heads = 2)
      : config{.layers = 2,
               .heads = 4,
               .kv_heads = kv_heads,
               .embd = 16,
               .ffn = 24,
               .seq_len = 8,
               .vocab = 11},
        model(make_llama(config)) {}
  MicroBatch mb() const {
    MicroBatch b;
    b.shape = {.B = 2, .T = 5};
    b.tokens = tokens;
    b.targets = targets;
    return b;
  }
};

// As the gpt's (gpt_test.cc): the fp32 rounding of a loss near ln 11 over steps of 1e-2 and
// 5e-3 is ~1e-4; the gradients checked are ~1e-3 to 1e-1.
constexpr model_testing::Tolerance kModelTolerance{1e-2f, 3e-4, 1e-3};

TEST(LlamaGradients, EveryParameterMatchesFiniteDifferencesWithGroupsOfTwo) {
  TinyLlama g(2);
  Buffers w = random_weights(g.model, 21, 0.3f);
  model_testing::expect_model_gradients_match(g.model, w, g.mb(), kModelTolerance);
}

TEST(LlamaGradients, EveryParameterMatchesFiniteDifferencesWithAKvHeadPerQueryHead) {
  TinyLlama g(4);
  Buffers w = random_weights(g.model, 22, 0.3f);
  model_testing::expect_model_gradients_match(g.model, w, g.mb(), kModelTolerance);
}

TEST(LlamaGradients, EveryParameterMatchesFiniteDifferencesWithOneKvHead) {
  TinyLlama g(1);
  Buffers w = random_weights(g.model, 23, 0.3f);
  model_testing::expect_model_gradients_match(g.model, w, g.mb(), kModelTolerance);
}

// With N(0, 0.02) weights the logits are near 0 (std 0.02 sqrt(C) = 0.11 for tiny), so the
// loss is near ln V: ln 256 = 5.545 plus about half the logits' variance.
TEST(LlamaGradients, TheLossAtInitIsNearLnV) {
  const LlamaConfig& c = llama_preset("tiny").config;
  const Model m = make_llama(c);
  Buffers w;
  for (const auto& u : m) w.push_back(initial_weights(1234, *u));
  const int B = 2, T = c.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 37 + 11) % 256);
    targets[i] = static_cast<int32_t>((i * 53 + 7) % 256);
  }
  MicroBatch mb;
  mb.shape = {.B = B, .T = T};
  mb.tokens = tokens;
  mb.targets = targets;
  EXPECT_NEAR(model_loss(m, w, mb), std::log(256.0), 0.05);
}

// Backward adds, and loss_grad_scale seeds it: a power of two scales every gradient exactly.
TEST(LlamaGradients, LossGradScaleScalesEveryGradientAndBackwardAdds) {
  TinyLlama g;
  const Buffers w = random_weights(g.model, 24, 0.3f);
  MicroBatch mb = g.mb();
  Buffers g1 = zero_grads(g.model), g4 = zero_grads(g.model);
  const float loss1 = model_loss_and_grads(g.model, w, mb, g1);
  mb.loss_grad_scale = 4.0f;
  const float loss4 = model_loss_and_grads(g.model, w, mb, g4);
  EXPECT_EQ(loss1, loss4);
  for (size_t u = 0; u < g1.size(); ++u) {
    for (size_t i = 0; i < g1[u].size(); ++i) {
      ASSERT_EQ(g4[u][i], 4.0f * g1[u][i]) << g.model[u]->name() << "[" << i << "]";
    }
  }
  // A second pass adds into g1: twice one pass (g4 / 2), up to the rounding of the additions
  // (relative to the unit's largest gradient: sums that cancel keep their roundings).
  model_loss_and_grads(g.model, w, g.mb(), g1);
  for (size_t u = 0; u < g1.size(); ++u) {
    float largest = 0.0f;
    for (const float x : g4[u]) largest = std::max(largest, std::abs(x) / 2);
    for (size_t i = 0; i < g1[u].size(); ++i) {
      ASSERT_NEAR(g1[u][i], g4[u][i] / 2, 1e-6f * largest) << g.model[u]->name() << "[" << i << "]";
    }
  }
}

TEST(LlamaTensorUse, LinearWeightsAndTheHeadAreReadOnlyAsBf16ProductOperands) {
  if (!gemm_bf16_native()) GTEST_SKIP() << "no native bf16 products: scopes are not consulted";
  for (const int kv : {2, 4, 1}) {
    SCOPED_TRACE(kv);
    TinyLlama g(kv);
    const Buffers w = random_weights(g.model, 25, 0.3f);
    model_testing::expect_product_operands_are_read_only_as_bf16(g.model, w, g.mb());
  }
}

// One forward and backward with every product in `compute`; weights given as their bf16
// rounding (widened) and, under kBF16, the stored bf16 copy, as the engine hands them.
float pass(const Model& model, const Buffers& w, GemmCompute compute, const MicroBatch& mb,
           Buffers& grads) {
  std::vector<std::vector<BFloat16>> stored;
  Buffers widened;
  for (const auto& flat : w) {
    stored.emplace_back(flat.size());
    convert(std::span<const float>(flat), std::span<BFloat16>(stored.back()));
    widened.emplace_back(flat.size());
    convert(std::span<const BFloat16>(stored.back()), std::span<float>(widened.back()));
  }
  const BatchShape& s = mb.shape;
  const size_t n = model.size();
  std::vector<std::vector<float>> acts(n), saved(n), dacts(n);
  size_t scratch_count = 0;
  for (size_t u = 0; u < n; ++u) {
    acts[u].resize(model[u]->output_count(s));
    saved[u].resize(model[u]->saved_count(s, compute));
    dacts[u].assign(model[u]->output_count(s), 0.0f);
    scratch_count = std::max(scratch_count, model[u]->scratch_count(s));
  }
  std::vector<float> scratch(scratch_count);
  const auto input_of = [&](size_t u) {
    return u == 0 ? std::span<const float>() : std::span<const float>(acts[u - 1]);
  };
  const auto weights_of = [&](size_t u) {
    return UnitWeights{.values = widened[u],
                       .stored_bf16 = compute == GemmCompute::kBF16
                                          ? std::span<const BFloat16>(stored[u])
                                          : std::span<const BFloat16>(),
                       .compute = compute};
  };
  for (size_t u = 0; u < n; ++u) {
    model[u]->forward(weights_of(u), input_of(u), acts[u], saved[u], scratch, mb);
  }
  for (size_t u = n; u-- > 0;) {
    std::span<float> din = u == 0 ? std::span<float>() : std::span<float>(dacts[u - 1]);
    model[u]->backward(weights_of(u), input_of(u), saved[u], dacts[u], grads[u], din, scratch, mb);
  }
  return acts.back()[0];
}

// bf16 products (and the bf16 pipeline's activations) against fp32 products on the same
// weights: the loss within 1 %, each unit's gradient within 5 % in L2; two bf16 runs give the
// same bits.
TEST(LlamaPrecision, Bf16ProductsRunAndStayCloseToFp32) {
  for (const int kv : {2, 1}) {
    SCOPED_TRACE(kv);
    TinyLlama g(kv);
    const Buffers w = random_weights(g.model, 26, 0.3f);
    Buffers g32 = zero_grads(g.model), g16 = zero_grads(g.model), again = zero_grads(g.model);
    const float l32 = pass(g.model, w, GemmCompute::kFP32, g.mb(), g32);
    const float l16 = pass(g.model, w, GemmCompute::kBF16, g.mb(), g16);
    const float l16b = pass(g.model, w, GemmCompute::kBF16, g.mb(), again);
    EXPECT_NEAR(l16, l32, 1e-2 * l32);
    EXPECT_EQ(std::memcmp(&l16, &l16b, sizeof(float)), 0);
    for (size_t u = 0; u < g32.size(); ++u) {
      double diff = 0, norm = 0;
      for (size_t i = 0; i < g32[u].size(); ++i) {
        diff += std::pow(static_cast<double>(g16[u][i]) - g32[u][i], 2);
        norm += std::pow(static_cast<double>(g32[u][i]), 2);
      }
      EXPECT_LT(std::sqrt(diff), 5e-2 * std::sqrt(norm)) << g.model[u]->name();
      EXPECT_EQ(std::memcmp(g16[u].data(), again[u].data(), g16[u].size() * sizeof(float)), 0)
          << g.model[u]->name();
    }
  }
}

// Under bf16 products a block keeps x1, qkv, attention's output, x2 and SwiGLU's output
// (C + 3C + C + C + F per row) in bf16, and the head its normed rows (C): half the floats.
TEST(LlamaPrecision, KeepProductInputsInBf16UnderBf16Products) {
  TinyLlama g;
  const BatchShape s = g.mb().shape;
  const size_t rows = 10, C = 16, F = 24, NH = 4;
  const Unit& block = *g.model[1];
  const Unit& head = *g.model.back();
  EXPECT_EQ(block.saved_count(s, GemmCompute::kFP32), rows * (7 * C + 3 * F + 2 * NH + 2));
  EXPECT_EQ(block.saved_count(s, GemmCompute::kFP32) - block.saved_count(s, GemmCompute::kBF16),
            rows * (6 * C + F) / 2);
  EXPECT_EQ(head.saved_count(s, GemmCompute::kFP32), rows * (C + 1));
  EXPECT_EQ(head.saved_count(s, GemmCompute::kFP32) - head.saved_count(s, GemmCompute::kBF16),
            rows * C / 2);
  EXPECT_EQ(g.model[0]->saved_count(s, GemmCompute::kBF16), 0u);
  // Scratch: the block's backward regions and attention's workspace, the head's dxn and blocks.
  EXPECT_EQ(head.scratch_count(s), rows * C + head_cross_entropy_scratch_count(11));
}

// Each unit runs forward and backward with saved and scratch of exactly its counts, in both
// computes (the sanitizer build would catch a piece carved past either).
TEST(LlamaPrecision, EveryUnitRunsWithExactlyItsCounts) {
  for (const GemmCompute compute : {GemmCompute::kFP32, GemmCompute::kBF16}) {
    TinyLlama g;
    const Buffers w = random_weights(g.model, 30, 0.3f);
    const MicroBatch mb = g.mb();
    const BatchShape& s = mb.shape;
    std::vector<float> in;
    for (const auto& unit : g.model) {
      SCOPED_TRACE(unit->name());
      const size_t u = static_cast<size_t>(&unit - g.model.data());
      std::vector<BFloat16> stored(w[u].size());
      convert(std::span<const float>(w[u]), std::span<BFloat16>(stored));
      const UnitWeights uw{.values = w[u],
                           .stored_bf16 = compute == GemmCompute::kBF16
                                              ? std::span<const BFloat16>(stored)
                                              : std::span<const BFloat16>(),
                           .compute = compute};
      std::vector<float> out(unit->output_count(s)), saved(unit->saved_count(s, compute));
      std::vector<float> scratch(unit->scratch_count(s));
      unit->forward(uw, in, out, saved, scratch, mb);
      std::vector<float> dout(out.size(), 0.01f), dw(w[u].size()), din(in.size());
      if (unit->output_count(s) == 1) dout.clear();
      unit->backward(uw, in, saved, dout, dw, din, scratch, mb);
      in = out;
    }
  }
}

// ---------------------------------------------------------------- llama_logits

// The mean cross-entropy of llama_logits at the targets (in double) is the head's loss within
// fp32 rounding: the head computes the same logits 64 rows at a time.
TEST(LlamaLogits, TheirCrossEntropyIsTheModelsLoss) {
  for (const int kv : {2, 4, 1}) {
    SCOPED_TRACE(kv);
    TinyLlama g(kv);
    const Buffers w = random_weights(g.model, 27, 0.3f);
    const std::vector<float> logits = llama_logits(g.config, w, g.tokens, 2, 5);
    ASSERT_EQ(logits.size(), 10u * 11u);
    double loss = 0;
    for (size_t r = 0; r < 10; ++r) {
      const float* l = logits.data() + r * 11;
      const double m = *std::max_element(l, l + 11);
      double sum = 0;
      for (size_t v = 0; v < 11; ++v) sum += std::exp(l[v] - m);
      loss += m + std::log(sum) - l[g.targets[r]];
    }
    loss /= 10;
    EXPECT_NEAR(model_loss(g.model, w, g.mb()), loss, 2e-6 * loss);
  }
}

// A sequence's logits at position t depend on tokens 0..t only: changing the later tokens
// leaves the earlier rows' bits as they were (attention gives a later position probability
// exactly 0; every other layer works row by row), and changes the rows from there on.
TEST(LlamaLogits, PositionTDoesNotSeeLaterTokens) {
  TinyLlama g;
  const Buffers w = random_weights(g.model, 28, 0.3f);
  const std::vector<float> before = llama_logits(g.config, w, g.tokens, 2, 5);
  std::vector<int32_t> changed = g.tokens;
  changed[3] = 4;  // sequence 0, positions 3 and 4
  changed[4] = 6;
  changed[9] = 0;  // sequence 1, position 4
  const std::vector<float> after = llama_logits(g.config, w, changed, 2, 5);
  const auto row = [](const std::vector<float>& l, size_t r) {
    return std::vector<float>(l.begin() + static_cast<std::ptrdiff_t>(r * 11),
                              l.begin() + static_cast<std::ptrdiff_t>((r + 1) * 11));
  };
  for (const size_t r : {0u, 1u, 2u, 5u, 6u, 7u, 8u}) {
    EXPECT_EQ(std::memcmp(row(before, r).data(), row(after, r).data(), 11 * sizeof(float)), 0)
        << "row " << r;
  }
  for (const size_t r : {3u, 4u, 9u}) EXPECT_NE(row(before, r), row(after, r)) << "row " << r;
}

TEST(LlamaLogits, RefusesWhatDoesNotFitTheModel) {
  TinyLlama g;
  const Buffers w = random_weights(g.model, 29, 0.3f);
  try {
    (void)llama_logits(g.config, w, std::vector<int32_t>(18, 1), 2, 9);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("seq_len=8"), std::string::npos) << e.what();
  }
  std::vector<int32_t> bad = g.tokens;
  bad[7] = 11;
  try {
    (void)llama_logits(g.config, w, bad, 2, 5);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token 11 at (b=1, t=2) is outside [0, V=11)"),
              std::string::npos)
        << e.what();
  }
  const Buffers short_w(w.begin(), w.end() - 1);
  EXPECT_THROW((void)llama_logits(g.config, short_w, g.tokens, 2, 5), InvalidArgument);
  MicroBatch mb = g.mb();
  mb.shape = {.B = 1, .T = 10};
  EXPECT_THROW((void)model_loss(g.model, w, mb), InvalidArgument);
}
// Issue 48's bound: at V = 32,768 and T = 1,024 the head's logits and their gradient, which the
// gpt's head holds for every row (saved logits, scratch dlogits), are held 64 rows at a time,
// at least 8x less. These counts are what the planner and the memory ledger take
// (Unit::saved_count, scratch_count), so the bound holds for both.
TEST(LlamaHead, HoldsItsLogitsAtLeastEightTimesLessThanTheWholeHead) {
  constexpr int kVocab = 32768, kSeq = 1024, kEmbd = 256;
  const Model llama = make_llama({.layers = 1,
                                  .heads = 4,
                                  .kv_heads = 2,
                                  .embd = kEmbd,
                                  .ffn = 704,
                                  .seq_len = kSeq,
                                  .vocab = kVocab});
  const Model gpt =
      make_gpt({.layers = 1, .heads = 4, .embd = kEmbd, .seq_len = kSeq, .vocab = kVocab});
  const BatchShape s{.B = 1, .T = kSeq};
  for (const GemmCompute compute : {GemmCompute::kFP32, GemmCompute::kBF16}) {
    const Unit& blocked = *llama.back();
    const Unit& whole = *gpt.back();
    const size_t blocked_floats = blocked.saved_count(s, compute) + blocked.scratch_count(s);
    const size_t whole_floats = whole.saved_count(s, compute) + whole.scratch_count(s);
    // The whole head's logits and gradient alone are 2 x T x V floats.
    EXPECT_GE(whole_floats, size_t{2} * kSeq * kVocab);
    EXPECT_GE(whole_floats, 8 * blocked_floats)
        << "blocked " << blocked_floats << " floats, whole " << whole_floats;
    // What the blocked head holds of the logits: two blocks of 64 rows.
    EXPECT_LE(blocked_floats, size_t{2} * kHeadBlockRows * kVocab + size_t{2} * kSeq * (kEmbd + 1));
  }
}

}  // namespace
}  // namespace zerodp
