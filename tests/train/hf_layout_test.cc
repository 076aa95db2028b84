// Hugging Face's layout: config.json written and read back to the same model, the names and
// transposes both ways, and every config key zerodp cannot hold refused by name.
#include "train/hf_layout.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "train/model_kind.h"

namespace zerodp {
namespace {

using nlohmann::json;

template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

ShapeFields shape_of(std::string_view kind, std::string_view size) {
  TrainConfig c;
  c.model = std::string(kind);
  c.size = std::string(size);
  const ModelKind& k = model_kind(kind);
  k.resolve(c);
  return k.shape(c);
}

TEST(HfLayout, ConfigJsonReadsBackToTheSameShapeForEveryPreset) {
  for (const auto& [kind, size] : {std::pair{"gpt", "tiny"},
                                   {"gpt", "medium"},
                                   {"llama", "tiny"},
                                   {"llama", "small"},
                                   {"llama", "1.1b"}}) {
    const ShapeFields shape = shape_of(kind, size);
    const json config = hf::config_json(kind, shape, "bfloat16");
    // Through text, as a file holds it.
    const hf::HfConfig back = hf::read_config(json::parse(config.dump()), "config.json");
    EXPECT_EQ(back.kind, kind) << size;
    EXPECT_EQ(back.shape, shape) << kind << " " << size;
    EXPECT_FALSE(back.tied) << kind << " " << size;
    EXPECT_EQ(config.at("torch_dtype"), "bfloat16");
  }
  const json llama = hf::config_json("llama", shape_of("llama", "1.1b"), "float32");
  EXPECT_EQ(llama.at("rms_norm_eps").dump(), "1e-05");  // the shortest decimal of the fp32 eps
  EXPECT_EQ(llama.at("num_key_value_heads"), 4);
  EXPECT_EQ(llama.at("intermediate_size"), 5632);
  EXPECT_EQ(llama.at("architectures"), json::array({"LlamaForCausalLM"}));
  const json gpt = hf::config_json("gpt", shape_of("gpt", "tiny"), "float32");
  EXPECT_EQ(gpt.at("activation_function"), "gelu");
  EXPECT_EQ(gpt.at("tie_word_embeddings"), false);
  EXPECT_EQ(gpt.at("architectures"), json::array({"GPT2LMHeadModel"}));
}

TEST(HfLayout, Gpt2NamesArePrefixedAndItsConv1dWeightsTransposedBothWays) {
  const hf::HfTensor c_attn = hf::export_tensor("gpt", "h.3.attn.c_attn.weight");
  EXPECT_EQ(c_attn.name, "transformer.h.3.attn.c_attn.weight");
  EXPECT_TRUE(c_attn.transposed);
  EXPECT_FALSE(hf::export_tensor("gpt", "h.3.attn.c_attn.bias").transposed);
  EXPECT_TRUE(hf::export_tensor("gpt", "h.0.mlp.c_proj.weight").transposed);
  EXPECT_FALSE(hf::export_tensor("gpt", "wte.weight").transposed);
  EXPECT_EQ(hf::export_tensor("gpt", "lm_head.weight").name, "lm_head.weight");
  EXPECT_EQ(hf::export_tensor("llama", "model.layers.0.mlp.up_proj.weight").name,
            "model.layers.0.mlp.up_proj.weight");
  EXPECT_FALSE(hf::export_tensor("llama", "model.layers.0.mlp.up_proj.weight").transposed);

  const hf::HfSource fc = hf::import_source("gpt", "h.1.mlp.c_fc.weight", false);
  EXPECT_EQ(fc.names,
            (std::vector<std::string>{"transformer.h.1.mlp.c_fc.weight", "h.1.mlp.c_fc.weight"}));
  EXPECT_TRUE(fc.transposed);
  EXPECT_EQ(hf::import_source("gpt", "lm_head.weight", true).names.back(), "wte.weight");
  EXPECT_EQ(hf::import_source("gpt", "lm_head.weight", false).names,
            std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(hf::import_source("llama", "lm_head.weight", true).names,
            std::vector<std::string>{"model.embed_tokens.weight"});

  EXPECT_TRUE(hf::skipped_on_import("gpt", "transformer.h.0.attn.bias", false));
  EXPECT_TRUE(hf::skipped_on_import("gpt", "h.11.attn.masked_bias", false));
  EXPECT_FALSE(hf::skipped_on_import("gpt", "h.0.attn.c_attn.bias", false));
  EXPECT_TRUE(
      hf::skipped_on_import("llama", "model.layers.2.self_attn.rotary_emb.inv_freq", false));
  EXPECT_TRUE(hf::skipped_on_import("llama", "lm_head.weight", true));
  EXPECT_FALSE(hf::skipped_on_import("llama", "lm_head.weight", false));
  EXPECT_NE(refusal([] {
              hf::export_tensor("mlp", "hidden.0.weight");
            }).find("mlp has no Hugging Face layout"),
            std::string::npos);
}

TEST(HfLayout, OptionalKeysTakeHuggingFacesDefaults) {
  const json llama = {{"model_type", "llama"},    {"hidden_size", 64},
                      {"intermediate_size", 172}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 4}, {"vocab_size", 300}};
  const hf::HfConfig l = hf::read_config(llama, "c");
  EXPECT_EQ(l.shape.at("kv_heads"), 4);
  EXPECT_EQ(l.shape.at("seq_len"), 2048);
  EXPECT_EQ(l.shape.at("rope_theta"), 10000);
  EXPECT_EQ(l.shape.at("norm_eps_fp32_bits"), std::bit_cast<uint32_t>(1e-6f));
  EXPECT_FALSE(l.tied);
  const json gpt2 = {{"model_type", "gpt2"},
                     {"n_embd", 64},
                     {"n_layer", 2},
                     {"n_head", 4},
                     {"n_positions", 1024},
                     {"vocab_size", 50257},
                     {"activation_function", "gelu"}};
  EXPECT_TRUE(hf::read_config(gpt2, "c").tied);  // GPT-2's default
}

TEST(HfLayout, EveryKeyZerodpCannotHoldIsRefusedByName) {
  const json llama = hf::config_json("llama", shape_of("llama", "tiny"), "float32");
  const json gpt2 = hf::config_json("gpt", shape_of("gpt", "tiny"), "float32");
  const auto refused = [](json j, const char* key, json value, const char* says) {
    if (value.is_null() && std::string(key) != "rope_scaling") {
      j.erase(key);
    } else {
      j[key] = value;
    }
    const std::string why = refusal([&] { hf::read_config(j, "dir/config.json"); });
    EXPECT_NE(why.find(says), std::string::npos) << key << ": " << why;
    EXPECT_NE(why.find("dir/config.json"), std::string::npos) << why;
  };
  refused(llama, "rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}},
          "\"rope_scaling\"");
  refused(llama, "attention_bias", true, "\"attention_bias\" is true");
  refused(llama, "mlp_bias", true, "\"mlp_bias\" is true");
  refused(llama, "head_dim", 8, "\"head_dim\" is 8");
  refused(llama, "hidden_act", "gelu", "\"hidden_act\" is \"gelu\"");
  refused(llama, "rope_theta", 10000.5, "\"rope_theta\" is 10000.5");
  refused(llama, "rms_norm_eps", -1, "\"rms_norm_eps\" is -1");
  refused(llama, "hidden_size", nullptr, "has no \"hidden_size\"");
  refused(llama, "num_hidden_layers", "2", "\"num_hidden_layers\" is \"2\"; give a whole number");
  refused(llama, "vocab_size", 0, "\"vocab_size\" is 0; zerodp takes 1 to");
  refused(llama, "model_type", "mistral", "\"model_type\" is \"mistral\"");
  refused(gpt2, "activation_function", "gelu_new", "\"gelu_new\" (the tanh approximation");
  refused(gpt2, "activation_function", nullptr, "\"gelu_new\"");  // GPT-2's default
  refused(gpt2, "n_inner", 100, "\"n_inner\" is 100");
  refused(gpt2, "layer_norm_epsilon", 1e-6, "\"layer_norm_epsilon\"");
  refused(gpt2, "scale_attn_by_inverse_layer_idx", true, "\"scale_attn_by_inverse_layer_idx\"");
  refused(gpt2, "n_embd", 1.5, "\"n_embd\" is 1.5");
  EXPECT_NE(refusal([] { hf::read_config(json::array(), "x"); }).find("not a JSON object"),
            std::string::npos);
}

}  // namespace
}  // namespace zerodp
