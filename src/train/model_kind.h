// The model kinds a run can name (TrainConfig::model), each described once: the data it
// trains on, how the resolved configuration builds it, the shape fields a checkpoint's
// meta.json keeps ("model": {"kind": ..., fields}) and how they build it back, its training
// FLOPs per token, and its name in messages. Every place that depends on the kind asks
// here; an unknown name is refused by model_kind() alone.
//
// "gpt", "llama" and "mlp" are built here; "custom-text" and "custom-images" only say which data to
// feed a model the caller builds (a ModelFactory passed to train()): they have no shape
// fields, and asking to build one is an InvalidArgument.
//
// It lives in train/, not models/, because an entry reads TrainConfig and names the data
// task, and models/ sits below both.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/format.h"
#include "data/dataset.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "models/model.h"
#include "train/config.h"

namespace zerodp {

// A model's shape as meta.json's "model" object holds it, "kind" aside.
using ShapeFields = std::map<std::string, int64_t>;

// Reads shape fields back from a checkpoint. Every failure is CorruptData naming `what`
// (the meta.json), the field, its value and what the kind expects.
class ShapeReader {
 public:
  // `units`: how many units meta.json's "units" lists. Borrows `fields`.
  ShapeReader(const ShapeFields& fields, std::string_view kind, std::string what, uint64_t units);
  // The field as an int in 0..INT_MAX; missing or out of range is CorruptData.
  int field(const char* key) const;
  // The same for a field of 0..max (a float's bits).
  int64_t field64(const char* key, int64_t max) const;
  // CorruptData unless the listed units number `units`: checked before anything is built,
  // so a hostile layer count never builds that many units. `which` names them for the
  // message, e.g. "(embedding, h.0.., head)".
  void expect_units(const char* key, int layers, uint64_t units, const char* which) const;
  const std::string& what() const { return what_; }

 private:
  const ShapeFields& fields_;
  std::string_view kind_;
  std::string what_;
  uint64_t units_;
};

struct ModelKind {
  std::string_view name;
  TaskKind task = TaskKind::kLanguageModel;
  // Has --size presets: messages name it with its size ("gpt small").
  bool sized = false;
  // Fills in what the kind leaves to defaults (a gpt's preset) and checks the kind's own
  // fields; InvalidArgument naming the flag otherwise. Called by resolve_config.
  void (*resolve)(TrainConfig& c) = nullptr;
  // The kind's options in config_json (the report's "config", meta.json's "config").
  void (*config_fields)(const TrainConfig& c, nlohmann::json& j) = nullptr;
  // Training FLOPs per token of a model of `params` parameters (plan.h's accounting).
  double (*flops_per_token)(const TrainConfig& c, double params) = nullptr;
  // The rest is null for a kind the caller builds.
  // The model of a resolved configuration (units' specs only, no weights).
  Model (*build)(const TrainConfig& c) = nullptr;
  // The shape fields meta.json keeps, and the same model built back from them.
  ShapeFields (*shape)(const TrainConfig& c) = nullptr;
  Model (*build_from_shape)(const ShapeReader& r) = nullptr;
};

// Every kind, the ones built here first.
std::span<const ModelKind> model_kinds();
// The kind named `name`; nullptr when there is none (a checkpoint written by other code).
const ModelKind* find_model_kind(std::string_view name);
// The kind named `name`; InvalidArgument naming it and the kinds --model takes otherwise.
const ModelKind& model_kind(std::string_view name);

inline constexpr std::string_view kGptKind = "gpt";
inline constexpr std::string_view kLlamaKind = "llama";

// How messages name a model: "gpt small" for a sized kind with a size, the kind alone
// otherwise (also for a kind this build does not know).
std::string model_label(std::string_view kind, std::string_view size);

// The shape fields of a checkpoint built back into its model. CorruptData naming `what`
// and the field for a missing, out-of-range or inconsistent field; InvalidArgument for a
// kind without shape fields.
Model build_from_checkpoint(const ModelKind& kind, const ShapeFields& fields,
                            const std::string& what, uint64_t units);
// The layout a checkpoint's meta.json is checked against before anything reads it (export,
// sample, a resume): the units the model of its own shape fields has. Throws CorruptData
// naming `what` and the field; nullopt for a kind built elsewhere (checked against itself).
std::optional<std::vector<checkpoint::UnitMeta>> checkpoint_model_layout(const checkpoint::Meta& m,
                                                                         const std::string& what);

// A gpt's configuration from its shape fields, checked as build_from_checkpoint checks
// them (for code that needs the GptConfig itself, such as sampling).
GptConfig gpt_config_from_shape(const ShapeReader& r);
LlamaConfig llama_config_from_shape(const ShapeReader& r);

}  // namespace zerodp
