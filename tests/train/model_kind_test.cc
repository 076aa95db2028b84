// The model registry: each kind's checkpoint fields build back the model its configuration
// builds, unknown kinds are refused in one message, and FLOPs follow plan.h.
#include "train/model_kind.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "train/plan.h"
#include "train/setup.h"

namespace zerodp {
namespace {

TrainConfig resolved(const std::string& model, const std::string& size = "small") {
  TrainConfig c;
  c.model = model;
  c.size = size;
  if (model == "custom-text") c.seq_len = 16;
  resolve_config(c);
  return c;
}

std::vector<TrainConfig> built_configs() {
  std::vector<TrainConfig> cs;
  for (const char* size : {"tiny", "small", "medium"}) cs.push_back(resolved("gpt", size));
  TrainConfig odd = resolved("gpt", "tiny");
  odd.layers = 3;
  odd.heads = 3;
  odd.embd = 24;
  odd.seq_len = 7;
  cs.push_back(odd);
  cs.push_back(resolved("mlp"));
  TrainConfig wide = resolved("mlp");
  wide.mlp_hidden = 33;
  wide.mlp_layers = 5;
  cs.push_back(wide);
  return cs;
}

template <typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelKind, EveryBuiltKindRoundTripsItsShapeFields) {
  for (const TrainConfig& c : built_configs()) {
    SCOPED_TRACE(c.model + " layers " + std::to_string(c.layers));
    const ModelKind& kind = model_kind(c.model);
    ASSERT_NE(kind.build, nullptr);
    ASSERT_NE(kind.shape, nullptr);
    const Model built = build_model(c);
    const ShapeFields fields = kind.shape(c);
    const Model back = build_from_checkpoint(kind, fields, "meta.json", built.size());
    ASSERT_EQ(back.size(), built.size());
    for (size_t i = 0; i < built.size(); ++i) {
      EXPECT_EQ(back[i]->name(), built[i]->name());
      EXPECT_EQ(back[i]->numel(), built[i]->numel());
      ASSERT_EQ(back[i]->tensors().size(), built[i]->tensors().size());
      for (size_t k = 0; k < built[i]->tensors().size(); ++k) {
        EXPECT_EQ(back[i]->tensors()[k].name, built[i]->tensors()[k].name);
        EXPECT_EQ(back[i]->tensors()[k].shape, built[i]->tensors()[k].shape);
      }
    }
  }
}

// meta.json's "model" object: these keys and values, as checkpoints have always held them.
TEST(ModelKind, ShapeFieldsAreTheCheckpointsKeys) {
  TrainConfig g = resolved("gpt", "tiny");
  EXPECT_EQ(
      model_kind("gpt").shape(g),
      (ShapeFields{{"embd", 32}, {"heads", 2}, {"layers", 2}, {"seq_len", 32}, {"vocab", 256}}));
  TrainConfig m = resolved("mlp");
  m.mlp_hidden = 40;
  m.mlp_layers = 3;
  EXPECT_EQ(model_kind("mlp").shape(m), (ShapeFields{{"hidden", 40}, {"hidden_layers", 3}}));
}

TEST(ModelKind, CustomKindsOnlyNameTheirData) {
  EXPECT_EQ(model_kind("gpt").task, TaskKind::kLanguageModel);
  EXPECT_EQ(model_kind("custom-text").task, TaskKind::kLanguageModel);
  EXPECT_EQ(model_kind("mlp").task, TaskKind::kImageClassification);
  EXPECT_EQ(model_kind("custom-images").task, TaskKind::kImageClassification);
  for (const char* name : {"custom-text", "custom-images"}) {
    SCOPED_TRACE(name);
    const ModelKind& kind = model_kind(name);
    EXPECT_EQ(kind.shape, nullptr);
    EXPECT_EQ(kind.build_from_shape, nullptr);
    EXPECT_THROW((void)build_model(resolved(name)), InvalidArgument);
    EXPECT_EQ(
        message_of([&] { (void)build_from_checkpoint(kind, {}, "meta.json", 0); }),
        "model '" + std::string(name) + "' is built by the caller: pass a ModelFactory to train()");
  }
}

TEST(ModelKind, UnknownKindIsRefusedNamingTheValueAndTheKnownKinds) {
  EXPECT_EQ(find_model_kind("cnn"), nullptr);
  EXPECT_THROW((void)model_kind("cnn"), InvalidArgument);
  EXPECT_EQ(message_of([] { (void)model_kind("cnn"); }),
            "--model 'cnn' is unknown; use gpt, llama or mlp");
  TrainConfig c;
  c.model = "Gpt";
  EXPECT_EQ(message_of([&] { resolve_config(c); }),
            "--model 'Gpt' is unknown; use gpt, llama or mlp");
}

TEST(ModelKind, FlopsPerTokenMatchTrainingFlopsPerToken) {
  for (const TrainConfig& c : built_configs()) {
    SCOPED_TRACE(c.model + " layers " + std::to_string(c.layers));
    double phi = 0;
    for (const auto& u : build_model(c)) phi += static_cast<double>(u->numel());
    const double expected = c.model == "gpt"
                                ? training_flops_per_token(phi, c.layers, c.seq_len, c.embd)
                                : training_flops_per_token(phi);
    EXPECT_EQ(model_kind(c.model).flops_per_token(c, phi), expected);
  }
  // The attention term counts: a gpt's FLOPs exceed 6 per parameter.
  const TrainConfig g = resolved("gpt", "tiny");
  EXPECT_GT(model_kind("gpt").flops_per_token(g, 1000), 6000);
  EXPECT_EQ(model_kind("custom-text").flops_per_token(resolved("custom-text"), 1000), 6000);
}

TEST(ModelKind, MessagesNameASizedKindWithItsSize) {
  EXPECT_EQ(model_label("gpt", "small"), "gpt small");
  EXPECT_EQ(model_label("gpt", ""), "gpt");
  EXPECT_EQ(model_label("mlp", "small"), "mlp");
  EXPECT_EQ(model_label("cnn", "small"), "cnn");
}

TEST(ModelKind, ConfigJsonHoldsEachKindsOwnOptions) {
  const nlohmann::json g = config_json(resolved("gpt", "tiny"));
  EXPECT_EQ(g.at("size"), "tiny");
  EXPECT_EQ(g.at("layers"), 2);
  EXPECT_FALSE(g.contains("mlp_hidden"));
  for (const char* name : {"mlp", "custom-images"}) {
    const nlohmann::json m = config_json(resolved(name));
    EXPECT_EQ(m.at("mlp_hidden"), 256) << name;
    EXPECT_FALSE(m.contains("size")) << name;
  }
}

TEST(ModelKind, ResolveAppliesEachKindsDefaults) {
  EXPECT_EQ(resolved("gpt", "tiny").micro_batch, 8);
  EXPECT_EQ(resolved("mlp").micro_batch, 64);
  TrainConfig c;
  c.model = "custom-text";
  EXPECT_EQ(message_of([&] { resolve_config(c); }),
            "model custom-text needs seq_len set to the model's sequence length");
  c.size = "huge";
  c.model = "gpt";
  EXPECT_EQ(message_of([&] { resolve_config(c); }),
            "--size 'huge' is unknown; use tiny, small, medium, large");
}

// A checkpoint's fields are read as the file says them: each failure names the field.
TEST(ModelKind, BadCheckpointFieldsAreCorruptDataNamingTheField) {
  const ModelKind& gpt = model_kind("gpt");
  const ShapeFields good = gpt.shape(resolved("gpt", "tiny"));
  const auto fails = [&](ShapeFields f, uint64_t units) {
    return message_of([&] { (void)build_from_checkpoint(gpt, f, "m.json", units); });
  };
  ShapeFields missing = good;
  missing.erase("heads");
  EXPECT_EQ(fails(missing, 4), "m.json: field \"model.heads\" is missing; a gpt has one");
  ShapeFields negative = good;
  negative["embd"] = -1;
  EXPECT_EQ(fails(negative, 4), "m.json: field \"model.embd\" is -1; expected 0..2147483647");
  EXPECT_EQ(fails(good, 5),
            "m.json: field \"model.layers\" is 2, but field \"units\" lists 5 units; a gpt with 2 "
            "layers has 4 (embedding, h.0.., head)");
  ShapeFields heads = good;
  heads["heads"] = 3;
  EXPECT_EQ(fails(heads, 4),
            "m.json: field \"model.heads\" is 3; it does not divide field \"model.embd\" (32)");
  ShapeFields zero = good;
  zero["vocab"] = 0;
  EXPECT_THROW((void)build_from_checkpoint(gpt, zero, "m.json", 4), CorruptData);
  EXPECT_EQ(fails(zero, 4).rfind("m.json: field \"model\" describes no valid gpt: ", 0), 0u);
  EXPECT_EQ(message_of([&] {
              (void)build_from_checkpoint(model_kind("mlp"), {{"hidden", 8}}, "m.json", 3);
            }),
            "m.json: field \"model.hidden_layers\" is missing; a mlp has one");
}

}  // namespace
}  // namespace zerodp
