// The gpt model: parameter counts, tensor layout and policy, whole-model gradients against
// finite differences, causality, and sequence lengths.
#include "models/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "model_testing.h"
#include "models/model.h"
#include "nn/layers.h"

namespace zerodp {
namespace {

using model_testing::Buffers;
using model_testing::random_weights;
using model_testing::zero_grads;

// Parameters by formula, independently of the units: token and position tables, per block
// two LayerNorms (4C), c_attn (3C*C + 3C), attn c_proj (C*C + C), c_fc (4C*C + 4C), mlp
// c_proj (4C*C + C) = 12C^2 + 13C, then ln_f (2C) and the untied head (V*C).
size_t gpt_params_by_formula(const GptConfig& c) {
  const size_t C = c.embd, V = c.vocab, S = c.seq_len, L = c.layers;
  return V * C + S * C + L * (12 * C * C + 13 * C) + 2 * C + V * C;
}

size_t preset_params(const char* name) {
  return parameter_count(make_gpt(gpt_preset(name).config));
}

// tiny 42,880; small 867,072; medium 10,893,312; large 86,235,648 (by the formula above).
TEST(GptParams, TinyIs42880) {
  EXPECT_EQ(preset_params("tiny"), 42880u);
  EXPECT_EQ(preset_params("tiny"), gpt_params_by_formula(gpt_preset("tiny").config));
}
TEST(GptParams, SmallIs867072) {
  EXPECT_EQ(preset_params("small"), 867072u);
  EXPECT_EQ(preset_params("small"), gpt_params_by_formula(gpt_preset("small").config));
}
TEST(GptParams, MediumIs10893312) {
  EXPECT_EQ(preset_params("medium"), 10893312u);
  EXPECT_EQ(preset_params("medium"), gpt_params_by_formula(gpt_preset("medium").config));
}
TEST(GptParams, LargeIs86235648) {  // "86M": GPT-2 small, vocabulary 256
  EXPECT_EQ(preset_params("large"), 86235648u);
  EXPECT_EQ(preset_params("large"), gpt_params_by_formula(gpt_preset("large").config));
}

TEST(GptPresets, ShapesAndMicroBatchesAreTheBriefs) {
  struct Want {
    const char* name;
    int layers, heads, embd, seq_len, micro_batch;
  };
  const Want want[] = {{"tiny", 2, 2, 32, 32, 8},
                       {"small", 4, 4, 128, 64, 16},
                       {"medium", 6, 6, 384, 128, 8},
                       {"large", 12, 12, 768, 1024, 4}};
  ASSERT_EQ(gpt_presets().size(), std::size(want));
  for (const Want& w : want) {
    const GptPreset& p = gpt_preset(w.name);
    EXPECT_EQ(p.config.layers, w.layers) << w.name;
    EXPECT_EQ(p.config.heads, w.heads) << w.name;
    EXPECT_EQ(p.config.embd, w.embd) << w.name;
    EXPECT_EQ(p.config.seq_len, w.seq_len) << w.name;
    EXPECT_EQ(p.config.vocab, 256) << w.name;
    EXPECT_EQ(p.micro_batch, w.micro_batch) << w.name;
  }
}

TEST(GptPresets, UnknownSizeNamesTheKnownOnes) {
  try {
    gpt_preset("huge");
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("huge"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("medium"), std::string::npos) << e.what();
  }
}

TEST(GptConfig, EmbdNotDivisibleByHeadsIsRejectedWithTheValues) {
  try {
    make_gpt({.layers = 1, .heads = 3, .embd = 10, .seq_len = 4});
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("embd 10"), std::string::npos) << what;
    EXPECT_NE(what.find("heads 3"), std::string::npos) << what;
    EXPECT_NE(what.find("12"), std::string::npos) << what;  // a multiple of 3 that would work
  }
}

TEST(GptConfig, NonPositiveFieldsAreRejected) {
  EXPECT_THROW(make_gpt({.layers = 0}), InvalidArgument);
  EXPECT_THROW(make_gpt({.heads = 0}), InvalidArgument);
  EXPECT_THROW(make_gpt({.embd = -4}), InvalidArgument);
  EXPECT_THROW(make_gpt({.seq_len = 0}), InvalidArgument);
  EXPECT_THROW(make_gpt({.vocab = 0}), InvalidArgument);
  EXPECT_NO_THROW(make_gpt({.layers = 1, .heads = 1, .embd = 1, .seq_len = 1, .vocab = 1}));
}

// ---------------------------------------------------------------- layout and policy

TEST(GptLayout, UnitsAreEmbeddingBlocksHead) {
  const Model m = make_gpt(gpt_preset("small").config);
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0]->name(), "embedding");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(m[i + 1]->name(), "h." + std::to_string(i));
  EXPECT_EQ(m[5]->name(), "head");
}

// PyTorch's state_dict order and shapes for the peer's module.
TEST(GptLayout, NamesAndShapesArePyTorchs) {
  const Model m = make_gpt({.layers = 2, .heads = 2, .embd = 8, .seq_len = 5});
  std::vector<std::pair<std::string, std::vector<int64_t>>> got;
  for (const auto& u : m) {
    for (const TensorSpec& t : u->tensors()) got.emplace_back(t.name, t.shape);
  }
  const std::vector<std::pair<std::string, std::vector<int64_t>>> block = {
      {"ln_1.weight", {8}},
      {"ln_1.bias", {8}},
      {"attn.c_attn.weight", {24, 8}},
      {"attn.c_attn.bias", {24}},
      {"attn.c_proj.weight", {8, 8}},
      {"attn.c_proj.bias", {8}},
      {"ln_2.weight", {8}},
      {"ln_2.bias", {8}},
      {"mlp.c_fc.weight", {32, 8}},
      {"mlp.c_fc.bias", {32}},
      {"mlp.c_proj.weight", {8, 32}},
      {"mlp.c_proj.bias", {8}}};
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {{"wte.weight", {256, 8}},
                                                                    {"wpe.weight", {5, 8}}};
  for (int i = 0; i < 2; ++i) {
    for (const auto& [name, shape] : block) {
      want.emplace_back("h." + std::to_string(i) + "." + name, shape);
    }
  }
  want.push_back({"ln_f.weight", {8}});
  want.push_back({"ln_f.bias", {8}});
  want.push_back({"lm_head.weight", {256, 8}});
  EXPECT_EQ(got, want);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(GptLayout, OffsetsContiguousNamesUniquePolicyAsSpecified) {
  for (const GptPreset& p : gpt_presets()) {
    const Model m = make_gpt(p.config);
    const float proj_std = static_cast<float>(0.02 / std::sqrt(2.0 * p.config.layers));
    std::set<std::string> names;
    for (const auto& u : m) {
      size_t offset = 0;
      for (const TensorSpec& t : u->tensors()) {
        SCOPED_TRACE(std::string(p.name) + " " + t.name);
        EXPECT_TRUE(names.insert(t.name).second) << "duplicate name";
        EXPECT_EQ(t.offset, offset);
        size_t numel = 1;
        for (const int64_t d : t.shape) numel *= static_cast<size_t>(d);
        EXPECT_EQ(t.numel, numel);
        offset += t.numel;
        const bool is_norm = t.name.find("ln_") != std::string::npos;
        const bool is_bias = ends_with(t.name, ".bias");
        EXPECT_EQ(t.weight_decay, !is_norm && !is_bias);
        if (is_bias) {
          EXPECT_EQ(t.init, InitKind::kZeros);
        } else if (is_norm) {
          EXPECT_EQ(t.init, InitKind::kOnes);
        } else {
          EXPECT_EQ(t.init, InitKind::kNormal);
          EXPECT_FLOAT_EQ(t.init_std, ends_with(t.name, "c_proj.weight") ? proj_std : 0.02f);
        }
      }
      EXPECT_EQ(offset, u->numel()) << u->name();
    }
  }
}

// ---------------------------------------------------------------- gradients

// B=2 sequences of T=5 tokens, layers 2, heads 2, embd 8.
struct TinyGpt {
  // A vocabulary of 32 instead of 256 keeps the finite differences cheap; nothing in the
  // units depends on V beyond the table sizes.
  GptConfig config{.layers = 2, .heads = 2, .embd = 8, .seq_len = 5, .vocab = 32};
  Model model = make_gpt(config);
  std::vector<int32_t> tokens = {3, 20, 17, 17, 31, 0, 12, 9, 3, 28};
  std::vector<int32_t> targets = {20, 17, 17, 31, 0, 12, 9, 3, 28, 7};
  MicroBatch mb() const {
    MicroBatch b;
    b.shape = {.B = 2, .T = 5};
    b.tokens = tokens;
    b.targets = targets;
    return b;
  }
};

// Tolerance (model_testing.h for the extrapolated differences). What remains is the fp32
// rounding of the loss (~4 here, ulp 5e-7): a few ulps over steps of 1e-2 and 5e-3 give
// ~1e-4 (measured worst: 8e-5). atol 3e-4 covers that; the gradients checked are ~1e-2 to
// 5e-1 (mean |g| per tensor 1e-2..1e-1), so a wrong term or a transposed weight is far
// outside. rtol covers the O(h^4) truncation left after the extrapolation.
constexpr model_testing::Tolerance kModelTolerance{1e-2f, 3e-4, 1e-3};

TEST(GptTensorUse, LinearWeightsAreReadOnlyAsBf16ProductOperands) {
  if (!gemm_bf16_native()) GTEST_SKIP() << "no native bf16 products: scopes are not consulted";
  TinyGpt g;
  const Buffers w = random_weights(g.model, 12, 0.3f);
  model_testing::expect_product_operands_are_read_only_as_bf16(g.model, w, g.mb());
}

TEST(GptGradients, EveryParameterMatchesFiniteDifferences) {
  TinyGpt g;
  Buffers w = random_weights(g.model, 11, 0.3f);
  model_testing::expect_model_gradients_match(g.model, w, g.mb(), kModelTolerance);
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (const float x : v) m = std::max(m, std::abs(x));
  return m;
}

// loss_grad_scale seeds the head's backward: every gradient is that multiple of the
// scale-1 gradient. A power of two commutes with every rounding, so 4 is exact. 0.3 rounds
// each term of every sum differently, and sums that cancel to ~0 keep those roundings, so
// the bound is relative to the unit's largest gradient, not to the element.
TEST(GptGradients, LossGradScaleScalesEveryGradient) {
  TinyGpt g;
  const Buffers w = random_weights(g.model, 12, 0.3f);
  MicroBatch mb = g.mb();
  Buffers g1 = zero_grads(g.model), g4 = zero_grads(g.model), g03 = zero_grads(g.model);
  const float loss1 = model_loss_and_grads(g.model, w, mb, g1);
  mb.loss_grad_scale = 4.0f;
  const float loss4 = model_loss_and_grads(g.model, w, mb, g4);
  mb.loss_grad_scale = 0.3f;
  model_loss_and_grads(g.model, w, mb, g03);
  EXPECT_EQ(loss1, loss4) << "the scale seeds backward only, the loss is unscaled";
  for (size_t u = 0; u < g1.size(); ++u) {
    for (size_t i = 0; i < g1[u].size(); ++i) {
      ASSERT_EQ(g4[u][i], 4.0f * g1[u][i]) << g.model[u]->name() << "[" << i << "]";
      ASSERT_NEAR(g03[u][i], 0.3f * g1[u][i], 1e-6f * max_abs(g1[u]))
          << g.model[u]->name() << "[" << i << "]";
    }
  }
}

// Backward adds: two passes into the same buffers give twice one pass, up to the rounding of
// the additions (relative to the unit's largest gradient, as above).
TEST(GptGradients, BackwardAddsIntoGradients) {
  TinyGpt g;
  const Buffers w = random_weights(g.model, 13, 0.3f);
  Buffers once = zero_grads(g.model), twice = zero_grads(g.model);
  model_loss_and_grads(g.model, w, g.mb(), once);
  model_loss_and_grads(g.model, w, g.mb(), twice);
  model_loss_and_grads(g.model, w, g.mb(), twice);
  for (size_t u = 0; u < once.size(); ++u) {
    for (size_t i = 0; i < once[u].size(); ++i) {
      ASSERT_NEAR(twice[u][i], 2.0f * once[u][i], 1e-6f * max_abs(once[u]))
          << g.model[u]->name() << "[" << i << "]";
    }
  }
}

// ---------------------------------------------------------------- causality and lengths

// With the last position's target ignored, the last token reaches nothing the loss sees:
// its attention probability from earlier positions is exactly 0, so the loss keeps its bits.
TEST(GptCausal, LastTokenDoesNotChangeEarlierPositions) {
  TinyGpt g;
  const Buffers w = random_weights(g.model, 14, 0.3f);
  g.targets[4] = kIgnoreTarget;
  g.targets[9] = kIgnoreTarget;
  const float before = model_loss(g.model, w, g.mb());
  g.tokens[4] = 1;
  g.tokens[9] = 2;
  EXPECT_EQ(model_loss(g.model, w, g.mb()), before);
  g.tokens[3] = 1;  // an earlier token does reach the loss
  EXPECT_NE(model_loss(g.model, w, g.mb()), before);
}

// T < seq_len uses wpe's first T rows: positions 0..2 of a T=3 batch see what positions
// 0..2 of a T=5 batch with the same prefix see (up to the last bits: gemm's blocking depends
// on the row count), and wpe's rows 3 and 4 get no gradient.
TEST(GptLength, ShorterSequencesMatchThePrefixOfLongerOnes) {
  TinyGpt g;
  const Buffers w = random_weights(g.model, 15, 0.3f);
  const std::vector<int32_t> short_tokens = {3, 20, 17, 0, 12, 9};
  const std::vector<int32_t> short_targets = {20, 17, 17, 12, 9, 3};
  MicroBatch short_mb;
  short_mb.shape = {.B = 2, .T = 3};
  short_mb.tokens = short_tokens;
  short_mb.targets = short_targets;
  Buffers grads = zero_grads(g.model);
  const float short_loss = model_loss_and_grads(g.model, w, short_mb, grads);
  for (const int i : {3, 4, 8, 9}) g.targets[i] = kIgnoreTarget;
  const float long_loss = model_loss(g.model, w, g.mb());
  EXPECT_NEAR(short_loss, long_loss, 1e-6f * long_loss);
  const TensorSpec& wpe = g.model[0]->tensors()[1];
  ASSERT_EQ(wpe.name, "wpe.weight");
  for (size_t i = 3 * 8; i < 5 * 8; ++i) EXPECT_EQ(grads[0][wpe.offset + i], 0.0f) << i;
  for (size_t i = 0; i < 3 * 8; ++i) EXPECT_NE(grads[0][wpe.offset + i], 0.0f) << i;
}

TEST(GptLength, LongerThanSeqLenIsAnError) {
  TinyGpt g;
  const Buffers w = random_weights(g.model, 16, 0.3f);
  const std::vector<int32_t> tokens(12, 1);
  MicroBatch mb;
  mb.shape = {.B = 2, .T = 6};
  mb.tokens = tokens;
  mb.targets = tokens;
  try {
    model_loss(g.model, w, mb);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("seq_len=5"), std::string::npos) << e.what();
  }
}

// Under bf16 products a block keeps its products' inputs (ln_1, qkv, attention's output,
// ln_2 and GELU's output: C + 3C + C + C + 4C per row) and the head its ln_f output (C per
// row) in bf16: half the floats of those.
TEST(GptUnits, KeepProductInputsInBf16UnderBf16Products) {
  TinyGpt g;
  const BatchShape s = g.mb().shape;
  const size_t rows = 10, C = 8;
  const Unit& block = *g.model[1];
  const Unit& head = *g.model.back();
  EXPECT_EQ(block.saved_count(s, GemmCompute::kFP32) - block.saved_count(s, GemmCompute::kBF16),
            rows * 10 * C / 2);
  EXPECT_EQ(head.saved_count(s, GemmCompute::kFP32) - head.saved_count(s, GemmCompute::kBF16),
            rows * C / 2);
  EXPECT_EQ(g.model[0]->saved_count(s, GemmCompute::kBF16), 0u);
}

TEST(GptUnits, WrongBufferLengthsAreRejected) {
  TinyGpt g;
  const Buffers w = random_weights(g.model, 17, 0.3f);
  const MicroBatch mb = g.mb();
  Unit& block = *g.model[1];
  std::vector<float> in(block.input_count(mb.shape)), out(block.output_count(mb.shape));
  std::vector<float> saved(block.saved_count(mb.shape, GemmCompute::kFP32));
  std::vector<float> scratch(block.scratch_count(mb.shape));
  const UnitWeights w1 = UnitWeights::fp32(w[1]);
  EXPECT_NO_THROW(block.forward(w1, in, out, saved, scratch, mb));
  std::vector<float> short_saved(saved.size() - 1);
  EXPECT_THROW(block.forward(w1, in, out, short_saved, scratch, mb), InvalidArgument);
  std::vector<float> short_scratch(scratch.size() - 1);
  EXPECT_THROW(block.forward(w1, in, out, saved, short_scratch, mb), InvalidArgument);
  EXPECT_THROW(block.forward(UnitWeights::fp32(std::span<const float>(w[1]).first(10)), in, out,
                             saved, scratch, mb),
               InvalidArgument);
}

}  // namespace
}  // namespace zerodp
