// The `gpt` model: nanoGPT's GPT with a byte vocabulary and an untied head, the model the
// PyTorch peer builds (docs/interop.md), as an ordered list of units:
//
//   "embedding"  wte.weight (V, C), wpe.weight (seq_len, C)           -> x (B, T, C)
//   "h.{i}"      pre-LN block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
//                ln_1.{weight,bias} (C), attn.c_attn.{weight (3C, C), bias (3C)},
//                attn.c_proj.{weight (C, C), bias (C)}, ln_2.{weight,bias} (C),
//                mlp.c_fc.{weight (4C, C), bias (4C)}, mlp.c_proj.{weight (C, 4C), bias (C)}
//   "head"       ln_f.{weight,bias} (C), lm_head.weight (V, C), no bias, untied
//                -> the mean cross-entropy over the micro-batch's counted targets (1 element)
//
// Tensor names and layouts are PyTorch's, so exported weights load into that module with
// load_state_dict. Numerics as the peer: exact-erf GELU, LayerNorm eps 1e-5, attention
// scaled by 1/sqrt(head_dim), causal. Init: N(0, 0.02) for weights and embeddings, the two
// c_proj weights N(0, 0.02/sqrt(2*layers)), biases 0, LayerNorm weight 1 / bias 0. Weight
// decay (as data in TensorSpec): off for biases and LayerNorm parameters, on otherwise.
//
// A micro-batch has B sequences of T tokens, 1 <= T <= seq_len (shorter sequences use the
// first T rows of wpe); mb.tokens and mb.targets are (B, T). Targets equal to
// kIgnoreTarget (nn/layers.h) are left out of the loss and of its mean.
#pragma once

#include <span>
#include <string_view>

#include "models/unit.h"

namespace zerodp {

// Defaults are the "small" preset.
struct GptConfig {
  int layers = 4;    // transformer blocks
  int heads = 4;     // attention heads; embd must be a multiple
  int embd = 128;    // channels C
  int seq_len = 64;  // longest sequence (rows of wpe)
  int vocab = 256;   // byte-level vocabulary
};

// Throws InvalidArgument naming the field, its value and what would work.
void validate(const GptConfig& config);

// The --size presets, with their default micro-batch.
struct GptPreset {
  std::string_view name;
  GptConfig config;
  int micro_batch = 0;
};
// tiny 2/2/32/32 b 8; small 4/4/128/64 b 16; medium 6/6/384/128 b 8; large 12/12/768/1024 b 4
// (GPT-2 small's shape: 86,235,648 parameters with the byte vocabulary).
std::span<const GptPreset> gpt_presets();
// Throws InvalidArgument naming the unknown size and the known ones.
const GptPreset& gpt_preset(std::string_view name);

// Validates `config` and builds its units (specs only: no weights are allocated).
Model make_gpt(const GptConfig& config);

}  // namespace zerodp
