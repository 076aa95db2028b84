// model_kind.h is the contract.
#include "train/model_kind.h"

#include <bit>
#include <limits>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "checkpoint/consolidate.h"
#include "core/error.h"
#include "data/dataset.h"
#include "models/llama.h"
#include "models/mlp.h"
#include "train/plan.h"

namespace zerodp {

ShapeReader::ShapeReader(const ShapeFields& fields, std::string_view kind, std::string what,
                         uint64_t units)
    : fields_(fields), kind_(kind), what_(std::move(what)), units_(units) {}

int ShapeReader::field(const char* key) const {
  const auto it = fields_.find(key);
  if (it == fields_.end()) {
    throw CorruptData(
        fmt::format("{}: field \"model.{}\" is missing; a {} has one", what_, key, kind_));
  }
  if (it->second < 0 || it->second > std::numeric_limits<int>::max()) {
    throw CorruptData(fmt::format("{}: field \"model.{}\" is {}; expected 0..{}", what_, key,
                                  it->second, std::numeric_limits<int>::max()));
  }
  return static_cast<int>(it->second);
}

int64_t ShapeReader::field64(const char* key, int64_t max) const {
  const auto it = fields_.find(key);
  if (it == fields_.end()) {
    throw CorruptData(
        fmt::format("{}: field \"model.{}\" is missing; a {} has one", what_, key, kind_));
  }
  if (it->second < 0 || it->second > max) {
    throw CorruptData(
        fmt::format("{}: field \"model.{}\" is {}; expected 0..{}", what_, key, it->second, max));
  }
  return it->second;
}

void ShapeReader::expect_units(const char* key, int layers, uint64_t units,
                               const char* which) const {
  if (units != units_) {
    throw CorruptData(fmt::format(
        "{}: field \"model.{}\" is {}, but field \"units\" lists {} units; a {} with {} {} has "
        "{} {}",
        what_, key, layers, units_, kind_, layers, key, units, which));
  }
}

std::optional<std::vector<checkpoint::UnitMeta>> checkpoint_model_layout(const checkpoint::Meta& m,
                                                                         const std::string& what) {
  const ModelKind* kind = find_model_kind(m.model_kind);
  if (kind == nullptr || kind->build_from_shape == nullptr) return std::nullopt;
  return checkpoint::describe_units(
      build_from_checkpoint(*kind, m.model_shape, what, m.units.size()));
}

GptConfig gpt_config_from_shape(const ShapeReader& r) {
  const GptConfig c{.layers = r.field("layers"),
                    .heads = r.field("heads"),
                    .embd = r.field("embd"),
                    .seq_len = r.field("seq_len"),
                    .vocab = r.field("vocab")};
  r.expect_units("layers", c.layers, uint64_t(c.layers) + 2, "(embedding, h.0.., head)");
  if (c.heads > 0 && c.embd % c.heads != 0) {
    throw CorruptData(
        fmt::format("{}: field \"model.heads\" is {}; it does not divide field \"model.embd\" ({})",
                    r.what(), c.heads, c.embd));
  }
  return c;
}

LlamaConfig llama_config_from_shape(const ShapeReader& r) {
  const LlamaConfig c{.layers = r.field("layers"),
                      .heads = r.field("heads"),
                      .kv_heads = r.field("kv_heads"),
                      .embd = r.field("embd"),
                      .ffn = r.field("ffn"),
                      .seq_len = r.field("seq_len"),
                      .vocab = r.field("vocab"),
                      .rope_theta = static_cast<float>(r.field("rope_theta")),
                      .norm_eps = std::bit_cast<float>(
                          static_cast<uint32_t>(r.field64("norm_eps_fp32_bits", UINT32_MAX)))};
  r.expect_units("layers", c.layers, uint64_t(c.layers) + 2, "(embedding, h.0.., head)");
  return c;
}

namespace {

GptConfig gpt_config(const TrainConfig& c) {
  return GptConfig{.layers = c.layers,
                   .heads = c.heads,
                   .embd = c.embd,
                   .seq_len = c.seq_len,
                   .vocab = c.vocab > 0 ? c.vocab : TokenDataset::kVocabSize};
}

LlamaConfig llama_config(const TrainConfig& c) {
  return LlamaConfig{.layers = c.layers,
                     .heads = c.heads,
                     .kv_heads = c.kv_heads,
                     .embd = c.embd,
                     .ffn = c.ffn_hidden,
                     .seq_len = c.seq_len,
                     .vocab = c.vocab,
                     .rope_theta = static_cast<float>(c.rope_theta),
                     .norm_eps = c.norm_eps};
}

MlpConfig mlp_config(const TrainConfig& c) {
  return MlpConfig{.hidden = c.mlp_hidden, .hidden_layers = c.mlp_layers};
}

void resolve_gpt(TrainConfig& c) {
  std::string known;
  bool found = false;
  for (const GptPreset& p : gpt_presets()) {
    known += fmt::format("{}{}", known.empty() ? "" : ", ", p.name);
    found = found || p.name == c.size;
  }
  if (!found) throw InvalidArgument(fmt::format("--size '{}' is unknown; use {}", c.size, known));
  const GptPreset& preset = gpt_preset(c.size);
  if (c.layers == 0) c.layers = preset.config.layers;
  if (c.heads == 0) c.heads = preset.config.heads;
  if (c.embd == 0) c.embd = preset.config.embd;
  if (c.seq_len == 0) c.seq_len = preset.config.seq_len;
  if (c.micro_batch == 0) c.micro_batch = preset.micro_batch;
  if (c.vocab == 0) c.vocab = TokenDataset::kVocabSize;
  validate(gpt_config(c));
}

// A field the user left out takes the preset's; SwiGLU's width follows the embedding's when
// that was given (the preset's is the same rule at the preset's width).
void resolve_llama(TrainConfig& c) {
  const LlamaPreset& preset = llama_preset(c.size);
  const LlamaConfig& p = preset.config;
  if (c.layers == 0) c.layers = p.layers;
  if (c.heads == 0) c.heads = p.heads;
  if (c.kv_heads == 0) c.kv_heads = p.kv_heads;
  if (c.embd == 0) c.embd = p.embd;
  if (c.ffn_hidden == 0) c.ffn_hidden = llama_ffn_hidden(c.embd, llama_ffn_multiple(c.embd));
  if (c.seq_len == 0) c.seq_len = p.seq_len;
  if (c.vocab == 0) c.vocab = p.vocab;
  if (c.rope_theta == 0) c.rope_theta = static_cast<int>(p.rope_theta);
  if (c.norm_eps == 0) c.norm_eps = p.norm_eps;
  if (c.micro_batch == 0) c.micro_batch = preset.micro_batch;
  validate(llama_config(c));
}

// The kinds without presets take 64 samples per micro-batch unless told.
void resolve_unsized(TrainConfig& c) {
  if (c.micro_batch == 0) c.micro_batch = 64;
}

void resolve_custom_text(TrainConfig& c) {
  if (c.seq_len < 1) {
    throw InvalidArgument("model custom-text needs seq_len set to the model's sequence length");
  }
  resolve_unsized(c);
}

void gpt_config_fields(const TrainConfig& c, nlohmann::json& j) {
  j["size"] = c.size;
  j["layers"] = c.layers;
  j["heads"] = c.heads;
  j["embd"] = c.embd;
  j["seq_len"] = c.seq_len;
  j["vocab"] = c.vocab;
}

void llama_config_fields(const TrainConfig& c, nlohmann::json& j) {
  gpt_config_fields(c, j);
  j["kv_heads"] = c.kv_heads;
  j["ffn_hidden"] = c.ffn_hidden;
  j["rope_theta"] = c.rope_theta;
  j["norm_eps"] = c.norm_eps;
  j["head"] = c.head;
}

// The custom kinds write these too, as they always have: meta.json's bytes and the
// cross-rank digest stay what they were.
void mlp_config_fields(const TrainConfig& c, nlohmann::json& j) {
  j["mlp_hidden"] = c.mlp_hidden;
  j["mlp_layers"] = c.mlp_layers;
}

double gpt_flops(const TrainConfig& c, double params) {
  return training_flops_per_token(params, c.layers, c.seq_len, c.embd);
}

// No attention: the 6 FLOPs per parameter alone.
double dense_flops(const TrainConfig&, double params) { return training_flops_per_token(params); }

ShapeFields gpt_shape(const TrainConfig& c) {
  const GptConfig g = gpt_config(c);
  return {{"layers", g.layers},
          {"heads", g.heads},
          {"embd", g.embd},
          {"seq_len", g.seq_len},
          {"vocab", g.vocab}};
}

// RMSNorm's eps is a float: the shape keeps its fp32 bits, so a resume builds it back exactly.
ShapeFields llama_shape(const TrainConfig& c) {
  const LlamaConfig l = llama_config(c);
  return {{"layers", l.layers},
          {"heads", l.heads},
          {"kv_heads", l.kv_heads},
          {"embd", l.embd},
          {"ffn", l.ffn},
          {"seq_len", l.seq_len},
          {"vocab", l.vocab},
          {"rope_theta", c.rope_theta},
          {"norm_eps_fp32_bits", std::bit_cast<uint32_t>(l.norm_eps)}};
}

ShapeFields mlp_shape(const TrainConfig& c) {
  return {{"hidden", c.mlp_hidden}, {"hidden_layers", c.mlp_layers}};
}

Model mlp_from_shape(const ShapeReader& r) {
  MlpConfig c;
  c.hidden = r.field("hidden");
  c.hidden_layers = r.field("hidden_layers");
  r.expect_units("hidden_layers", c.hidden_layers, uint64_t(c.hidden_layers) + 1,
                 "(hidden.., head)");
  return make_mlp(c);
}

double llama_flops(const TrainConfig& c, double params) {
  return training_flops_per_token(params, c.layers, c.seq_len, c.embd);
}

constexpr ModelKind kKinds[] = {
    {.name = kGptKind,
     .task = TaskKind::kLanguageModel,
     .sized = true,
     .resolve = resolve_gpt,
     .config_fields = gpt_config_fields,
     .flops_per_token = gpt_flops,
     .build = [](const TrainConfig& c) { return make_gpt(gpt_config(c)); },
     .shape = gpt_shape,
     .build_from_shape = [](const ShapeReader& r) { return make_gpt(gpt_config_from_shape(r)); }},
    {.name = kLlamaKind,
     .task = TaskKind::kLanguageModel,
     .sized = true,
     .resolve = resolve_llama,
     .config_fields = llama_config_fields,
     .flops_per_token = llama_flops,
     .build = [](const TrainConfig& c) { return make_llama(llama_config(c)); },
     .shape = llama_shape,
     .build_from_shape =
         [](const ShapeReader& r) { return make_llama(llama_config_from_shape(r)); }},
    {.name = "mlp",
     .task = TaskKind::kImageClassification,
     .resolve = resolve_unsized,
     .config_fields = mlp_config_fields,
     .flops_per_token = dense_flops,
     .build = [](const TrainConfig& c) { return make_mlp(mlp_config(c)); },
     .shape = mlp_shape,
     .build_from_shape = mlp_from_shape},
    {.name = "custom-text",
     .task = TaskKind::kLanguageModel,
     .resolve = resolve_custom_text,
     .config_fields = mlp_config_fields,
     .flops_per_token = dense_flops},
    {.name = "custom-images",
     .task = TaskKind::kImageClassification,
     .resolve = resolve_unsized,
     .config_fields = mlp_config_fields,
     .flops_per_token = dense_flops},
};

}  // namespace

std::span<const ModelKind> model_kinds() { return kKinds; }

const ModelKind* find_model_kind(std::string_view name) {
  for (const ModelKind& k : kKinds) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

const ModelKind& model_kind(std::string_view name) {
  if (const ModelKind* k = find_model_kind(name)) return *k;
  // The kinds --model takes: the custom ones are for library callers with a ModelFactory.
  std::vector<std::string_view> known;
  for (const ModelKind& k : kKinds) {
    if (k.build != nullptr) known.push_back(k.name);
  }
  const auto head = std::span(known).first(known.size() - 1);
  throw InvalidArgument(fmt::format("--model '{}' is unknown; use {} or {}", name,
                                    fmt::join(head, ", "), known.back()));
}

std::string model_label(std::string_view kind, std::string_view size) {
  const ModelKind* k = find_model_kind(kind);
  return k != nullptr && k->sized && !size.empty() ? fmt::format("{} {}", kind, size)
                                                   : std::string(kind);
}

Model build_from_checkpoint(const ModelKind& kind, const ShapeFields& fields,
                            const std::string& what, uint64_t units) {
  if (kind.build_from_shape == nullptr) {
    throw InvalidArgument(fmt::format(
        "model '{}' is built by the caller: pass a ModelFactory to train()", kind.name));
  }
  try {
    return kind.build_from_shape(ShapeReader(fields, kind.name, what, units));
  } catch (const InvalidArgument& e) {
    throw CorruptData(
        fmt::format("{}: field \"model\" describes no valid {}: {}", what, kind.name, e.what()));
  }
}

}  // namespace zerodp
