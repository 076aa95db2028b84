// hf_layout.h is the contract.
#include "train/hf_layout.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/core.h>

#include "core/error.h"
#include "nn/layers.h"

namespace zerodp::hf {
namespace {

constexpr std::string_view kGptPrefix = "transformer.";

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// GPT-2's Conv1D layers; its LayerNorms, embeddings and biases keep zerodp's shapes.
bool gpt_conv1d(std::string_view name) {
  for (const std::string_view tail :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (ends_with(name, tail)) return true;
  }
  return false;
}

void require_layout(std::string_view kind) {
  if (!has_layout(kind)) {
    throw InvalidArgument(fmt::format(
        "a model of kind {} has no Hugging Face layout; the gpt (as GPT-2) and the llama have one",
        kind));
  }
}

// A key of config.json, read as the type zerodp needs; InvalidArgument naming the file and
// the key otherwise.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, const std::string& what) : j_(j), what_(what) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int64_t whole(const char* key, int64_t lo, int64_t hi) const {
    if (!has(key)) throw InvalidArgument(fmt::format("{}: has no \"{}\"", what_, key));
    return whole_value(key, lo, hi);
  }
  int64_t whole(const char* key, int64_t lo, int64_t hi, int64_t otherwise) const {
    return has(key) ? whole_value(key, lo, hi) : otherwise;
  }
  double number(const char* key, double otherwise) const {
    if (!has(key)) return otherwise;
    const nlohmann::json& v = j_.at(key);
    if (!v.is_number()) {
      throw InvalidArgument(fmt::format("{}: \"{}\" is {}; give a number", what_, key, v.dump()));
    }
    return v.get<double>();
  }
  bool flag(const char* key, bool otherwise) const {
    if (!has(key)) return otherwise;
    const nlohmann::json& v = j_.at(key);
    if (!v.is_boolean()) {
      throw InvalidArgument(
          fmt::format("{}: \"{}\" is {}; give true or false", what_, key, v.dump()));
    }
    return v.get<bool>();
  }
  std::string text(const char* key, const std::string& otherwise) const {
    if (!has(key)) return otherwise;
    const nlohmann::json& v = j_.at(key);
    if (!v.is_string()) {
      throw InvalidArgument(fmt::format("{}: \"{}\" is {}; give a string", what_, key, v.dump()));
    }
    return v.get<std::string>();
  }
  // A key naming a feature zerodp does not implement, refused unless it holds `off`.
  void refuse_unless(const char* key, const nlohmann::json& off, std::string_view why) const {
    if (has(key) && j_.at(key) != off) {
      throw InvalidArgument(
          fmt::format("{}: \"{}\" is {}; {}", what_, key, j_.at(key).dump(), why));
    }
  }
  [[noreturn]] void refuse(const char* key, std::string_view why) const {
    throw InvalidArgument(fmt::format("{}: \"{}\" is {}; {}", what_, key, j_.at(key).dump(), why));
  }

 private:
  int64_t whole_value(const char* key, int64_t lo, int64_t hi) const {
    const nlohmann::json& v = j_.at(key);
    const bool integral = v.is_number_integer() || (v.is_number_float() && [&] {
                            const double d = v.get<double>();
                            return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15;
                          }());
    if (!integral) {
      throw InvalidArgument(
          fmt::format("{}: \"{}\" is {}; give a whole number", what_, key, v.dump()));
    }
    const int64_t n =
        v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
    if (n < lo || n > hi) {
      throw InvalidArgument(
          fmt::format("{}: \"{}\" is {}; zerodp takes {} to {}", what_, key, n, lo, hi));
    }
    return n;
  }

  const nlohmann::json& j_;
  const std::string& what_;
};

constexpr int64_t kMaxField = std::numeric_limits<int32_t>::max();

// A float as config.json shows it: the shortest decimal that reads back as the same fp32
// (1e-05, not 9.99999974737875e-06), since Hugging Face adds it to fp32 values.
double shortest(float f) { return std::stod(fmt::format("{}", f)); }

HfConfig read_gpt2(const ConfigReader& r, const std::string& what) {
  HfConfig out;
  out.kind = "gpt";
  const int64_t C = r.whole("n_embd", 1, kMaxField);
  const int64_t heads = r.whole("n_head", 1, kMaxField);
  out.shape = {{"layers", r.whole("n_layer", 1, kMaxField)},
               {"heads", heads},
               {"embd", C},
               {"seq_len", r.whole("n_positions", 1, kMaxField)},
               {"vocab", r.whole("vocab_size", 1, kMaxField)}};
  if (const std::string act = r.text("activation_function", "gelu_new"); act != "gelu") {
    throw InvalidArgument(fmt::format(
        "{}: \"activation_function\" is \"{}\"{}; zerodp's gpt has the exact (erf) GELU, "
        "\"gelu\", and no other",
        what, act,
        act == "gelu_new" ? " (the tanh approximation; also GPT-2's default when absent)" : ""));
  }
  if (r.has("n_inner") && r.whole("n_inner", 1, kMaxField) != 4 * C) {
    r.refuse("n_inner", fmt::format("zerodp's gpt has an MLP of 4 n_embd ({})", 4 * C));
  }
  if (const double eps = r.number("layer_norm_epsilon", 1e-5);
      static_cast<float>(eps) != kLayerNormEps) {
    r.refuse("layer_norm_epsilon", "zerodp's gpt has LayerNorm's eps 1e-5");
  }
  r.refuse_unless("scale_attn_weights", true, "zerodp's gpt scales scores by 1/sqrt(head size)");
  r.refuse_unless("scale_attn_by_inverse_layer_idx", false,
                  "zerodp's gpt does not scale attention by the layer");
  r.refuse_unless("add_cross_attention", false, "zerodp's gpt is a decoder alone");
  out.tied = r.flag("tie_word_embeddings", true);
  return out;
}

HfConfig read_llama(const ConfigReader& r) {
  HfConfig out;
  out.kind = "llama";
  const int64_t C = r.whole("hidden_size", 1, kMaxField);
  const int64_t heads = r.whole("num_attention_heads", 1, kMaxField);
  if (r.has("head_dim") && (C % heads != 0 || r.whole("head_dim", 1, kMaxField) != C / heads)) {
    r.refuse(
        "head_dim",
        fmt::format("zerodp's llama has hidden_size / num_attention_heads ({} / {})", C, heads));
  }
  if (const std::string act = r.text("hidden_act", "silu"); act != "silu") {
    r.refuse("hidden_act", "zerodp's llama has SwiGLU's \"silu\" and no other");
  }
  r.refuse_unless("rope_scaling", nullptr,
                  "zerodp's llama has plain RoPE (Llama-3's and other scalings are not built)");
  r.refuse_unless("attention_bias", false, "zerodp's llama has no biases");
  r.refuse_unless("mlp_bias", false, "zerodp's llama has no biases");
  const double theta = r.number("rope_theta", 10000.0);
  if (!(theta >= 1 && theta <= kMaxField && theta == std::floor(theta))) {
    r.refuse("rope_theta", "zerodp takes a whole rotary base from 1 up");
  }
  const double eps = r.number("rms_norm_eps", 1e-6);
  if (!(eps > 0 && eps < 1)) r.refuse("rms_norm_eps", "give a small positive number, e.g. 1e-5");
  out.shape = {{"layers", r.whole("num_hidden_layers", 1, kMaxField)},
               {"heads", heads},
               {"kv_heads", r.whole("num_key_value_heads", 1, kMaxField, heads)},
               {"embd", C},
               {"ffn", r.whole("intermediate_size", 1, kMaxField)},
               {"seq_len", r.whole("max_position_embeddings", 1, kMaxField, 2048)},
               {"vocab", r.whole("vocab_size", 1, kMaxField)},
               {"rope_theta", static_cast<int64_t>(theta)},
               {"norm_eps_fp32_bits", std::bit_cast<uint32_t>(static_cast<float>(eps))}};
  out.tied = r.flag("tie_word_embeddings", false);
  return out;
}

int64_t at(const ShapeFields& s, const char* key) {
  const auto it = s.find(key);
  if (it == s.end()) throw InvalidArgument(fmt::format("the model's shape has no field {}", key));
  return it->second;
}

}  // namespace

bool has_layout(std::string_view kind) { return kind == kGptKind || kind == kLlamaKind; }

HfTensor export_tensor(std::string_view kind, std::string_view name) {
  require_layout(kind);
  if (kind == kLlamaKind || name == "lm_head.weight") return {std::string(name), false};
  return {std::string(kGptPrefix) + std::string(name), gpt_conv1d(name)};
}

HfSource import_source(std::string_view kind, std::string_view name, bool tied) {
  require_layout(kind);
  if (kind == kLlamaKind) {
    return {{tied && name == "lm_head.weight" ? "model.embed_tokens.weight" : std::string(name)},
            false};
  }
  const std::string n = tied && name == "lm_head.weight" ? "wte.weight" : std::string(name);
  if (n == "lm_head.weight") return {{n}, false};
  return {{std::string(kGptPrefix) + n, n}, gpt_conv1d(n)};
}

bool skipped_on_import(std::string_view kind, std::string_view hf_name, bool tied) {
  if (tied && hf_name == "lm_head.weight") return true;
  if (kind == kLlamaKind) return ends_with(hf_name, ".self_attn.rotary_emb.inv_freq");
  return ends_with(hf_name, ".attn.bias") || ends_with(hf_name, ".attn.masked_bias");
}

nlohmann::json config_json(std::string_view kind, const ShapeFields& s,
                           std::string_view torch_dtype) {
  require_layout(kind);
  if (kind == kGptKind) {
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", at(s, "vocab")},
            {"n_positions", at(s, "seq_len")},
            {"n_ctx", at(s, "seq_len")},
            {"n_embd", at(s, "embd")},
            {"n_layer", at(s, "layers")},
            {"n_head", at(s, "heads")},
            {"n_inner", nullptr},
            {"activation_function", "gelu"},
            {"layer_norm_epsilon", shortest(kLayerNormEps)},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"initializer_range", 0.02},
            {"scale_attn_weights", true},
            {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false},
            {"tie_word_embeddings", false},
            {"use_cache", true},
            {"torch_dtype", torch_dtype}};
  }
  const float eps = std::bit_cast<float>(static_cast<uint32_t>(at(s, "norm_eps_fp32_bits")));
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", at(s, "vocab")},
          {"hidden_size", at(s, "embd")},
          {"intermediate_size", at(s, "ffn")},
          {"num_hidden_layers", at(s, "layers")},
          {"num_attention_heads", at(s, "heads")},
          {"num_key_value_heads", at(s, "kv_heads")},
          {"head_dim", at(s, "embd") / at(s, "heads")},
          {"max_position_embeddings", at(s, "seq_len")},
          {"rms_norm_eps", shortest(eps)},
          {"rope_theta", static_cast<double>(at(s, "rope_theta"))},
          {"rope_scaling", nullptr},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"initializer_range", 0.02},
          {"pretraining_tp", 1},
          {"tie_word_embeddings", false},
          {"use_cache", true},
          {"torch_dtype", torch_dtype}};
}

HfConfig read_config(const nlohmann::json& config, const std::string& what) {
  if (!config.is_object()) {
    throw InvalidArgument(
        fmt::format("{}: is not a JSON object; give a Hugging Face config.json", what));
  }
  const ConfigReader r(config, what);
  const std::string type = r.text("model_type", "");
  if (type == "gpt2") return read_gpt2(r, what);
  if (type == "llama") return read_llama(r);
  throw InvalidArgument(
      fmt::format("{}: \"model_type\" is {}; zerodp reads \"gpt2\" (its gpt) and \"llama\"", what,
                  r.has("model_type") ? config.at("model_type").dump() : "missing"));
}

}  // namespace zerodp::hf
