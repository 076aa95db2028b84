// Hugging Face's layout of the two language-model families, both ways: the gpt as GPT-2
// (GPT2LMHeadModel) and the llama as LlamaForCausalLM. Their tensor names, GPT-2's Conv1D
// transposes, the names real files carry that are not parameters, and config.json.
//
// zerodp's llama already uses Hugging Face's names and shapes: its mapping is the identity.
// zerodp's gpt uses PyTorch's nn.Linear layout (docs/interop.md): GPT-2's Conv1D holds
// c_attn, c_proj and c_fc as (in, out), the transpose, under "transformer.".
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/model_kind.h"

namespace zerodp::hf {

// Where one of zerodp's tensors lives in Hugging Face's files.
struct HfTensor {
  std::string name;         // e.g. "transformer.h.0.attn.c_attn.weight"
  bool transposed = false;  // Hugging Face holds (in, out) where zerodp holds (out, in)
};

// True for the kinds with a Hugging Face layout ("gpt", "llama").
bool has_layout(std::string_view kind);

// The name and orientation `zerodp export --format hf` writes zerodp tensor `name` of a model
// of `kind` under: GPT2LMHeadModel's save_pretrained names (prefixed "transformer.", the
// head "lm_head.weight"), LlamaForCausalLM's as they are. InvalidArgument for a kind without
// a layout, naming it.
HfTensor export_tensor(std::string_view kind, std::string_view name);

// Where an import finds zerodp tensor `name`: the names to look for, in order (GPT-2's files
// come with and without "transformer."), and the orientation. With a tied head (`tied`)
// zerodp's untied lm_head.weight is read from the token embedding.
struct HfSource {
  std::vector<std::string> names;
  bool transposed = false;
};
HfSource import_source(std::string_view kind, std::string_view name, bool tied);

// A tensor real files carry that is no parameter, skipped by name on import: GPT-2's
// attention masks (h.N.attn.bias, h.N.attn.masked_bias), Llama's rotary buffers
// (model.layers.N.self_attn.rotary_emb.inv_freq), and with a tied head the head itself.
bool skipped_on_import(std::string_view kind, std::string_view hf_name, bool tied);

// config.json for a model of `kind` with meta.json's shape fields, its weights stored as
// `torch_dtype` ("float32" or "bfloat16"): every field Hugging Face's GPT2Config or
// LlamaConfig needs to rebuild the model zerodp trained (untied head, exact-erf GELU "gelu"
// for the gpt, no dropout, no biases for the llama, RoPE θ and RMSNorm's eps as zerodp holds
// them). InvalidArgument for a kind without a layout.
nlohmann::json config_json(std::string_view kind, const ShapeFields& shape,
                           std::string_view torch_dtype);

// A config.json read back: the model as meta.json's fields describe it.
struct HfConfig {
  std::string kind;   // "gpt" or "llama"
  ShapeFields shape;  // the fields checkpoint meta.json keeps for that kind
  bool tied = false;  // tie_word_embeddings (GPT-2's default is true, Llama's false)
};

// InvalidArgument naming `what` (the file) and the key for a config zerodp cannot hold: a
// model_type other than gpt2 or llama, a missing size key, or a feature zerodp does not
// implement (rope_scaling, attention_bias or mlp_bias true, head_dim other than
// hidden_size / num_attention_heads, hidden_act other than silu, activation_function other
// than gelu, n_inner other than 4 n_embd, another layer_norm_epsilon, ...). Optional keys
// take Hugging Face's defaults (num_key_value_heads = num_attention_heads, rms_norm_eps
// 1e-6, rope_theta 10000, max_position_embeddings 2048, tie_word_embeddings per family).
HfConfig read_config(const nlohmann::json& config, const std::string& what);

}  // namespace zerodp::hf
