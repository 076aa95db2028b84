// The `llama` family (issue 48): RMSNorm (eps), rotary positions in the rotate-half order
// (theta), SwiGLU (gate, up, down of `ffn` hidden units), grouped-query attention (`kv_heads`
// dividing `heads`), no biases, an untied head; the layers are nn/layers.h's. As an ordered list
// of units (models/llama_units.cc), with Hugging Face's Llama tensor names, so import and export
// are a copy:
//
//   "embedding"  model.embed_tokens.weight (V, C)                      -> x (B, T, C)
//   "h.{i}"      pre-norm block: x = x + o(attn(rope(qkv(rmsnorm(x)))));
//                            x = x + down(silu(gate(rmsnorm(x))) * up(rmsnorm(x)))
//                model.layers.{i}.input_layernorm.weight (C),
//                  .self_attn.{q_proj (C, C), k_proj (KV hs, C), v_proj (KV hs, C),
//                  o_proj (C, C)}.weight, .post_attention_layernorm.weight (C),
//                  .mlp.{gate_proj (F, C), up_proj (F, C), down_proj (C, F)}.weight
//   "head"       model.norm.weight (C), lm_head.weight (V, C), untied
//                -> the mean cross-entropy over the micro-batch's counted targets (1 element)
//
// in this order in each unit's flat buffer (q, k, v consecutive: one ((C + 2 KV hs), C)
// product; gate, up likewise one (2F, C)). Init: N(0, 0.02) for the embedding and every Linear
// weight (no scaled residual init), RMSNorm weights 1. Weight decay off for the RMSNorm
// weights, on otherwise. Attention is causal, scaled by 1/sqrt(hs); query head h reads kv head
// h / (heads / kv_heads), as Hugging Face's repeat_kv. A micro-batch has B sequences of T
// tokens, 1 <= T <= seq_len; targets equal to kIgnoreTarget (nn/layers.h) are left out of the
// loss and of its mean.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "models/unit.h"

namespace zerodp {

// Defaults are the "small" preset.
struct LlamaConfig {
  int layers = 4;            // transformer blocks
  int heads = 4;             // query heads; embd must be a multiple, with an even head size
  int kv_heads = 2;          // key/value heads (grouped-query attention); divides heads
  int embd = 128;            // channels C
  int ffn = 384;             // SwiGLU's hidden units (llama_ffn_hidden's rule unless given)
  int seq_len = 64;          // longest sequence (rows of the rotary table)
  int vocab = 256;           // byte-level by default
  float rope_theta = 10000;  // rotary base
  float norm_eps = 1e-5f;    // RMSNorm's eps
  int head_size() const { return heads > 0 ? embd / heads : 0; }
};

// Throws InvalidArgument naming the field, its value and what would work.
void validate(const LlamaConfig& config);

// SwiGLU's hidden size from the channels, Llama's rule: 8C/3 truncated to an integer, then
// rounded up to a multiple of `multiple` (64 for C <= 384, 256 above: llama_ffn_multiple).
// 32 -> 128, 128 -> 384, 384 -> 1024, 768 -> 2048, 4096 -> 11008.
int llama_ffn_hidden(int embd, int multiple);
int llama_ffn_multiple(int embd);

// Parameters: the embedding and the head (V C each, untied), and per block two RMSNorm
// weights (C each), q and o (C C each), k and v (C x kv_heads hs each) and SwiGLU's three
// (C ffn each), and the final RMSNorm (C). The 1.1b preset's is TinyLlama's 1,100,048,384.
uint64_t llama_parameter_count(const LlamaConfig& config);

// The --size presets, with their default micro-batch (the GPT's at the same name).
struct LlamaPreset {
  std::string_view name;
  LlamaConfig config;
  int micro_batch = 0;
};
// tiny 2 layers/2 heads/1 KV/32/ffn 128/T 32 b 8; small 4/4/2/128/384/64 b 16;
// medium 6/6/2/384/1024/128 b 8; large 12/12/4/768/2048/1024 b 4, all with the byte
// vocabulary; 1.1b 22/32/4/2048/5632/2048, vocab 32000, b 1 (TinyLlama's shape). Every
// preset's ffn is llama_ffn_hidden's.
std::span<const LlamaPreset> llama_presets();
// Throws InvalidArgument naming the unknown size and the known ones.
const LlamaPreset& llama_preset(std::string_view name);

// Validates `config` and builds its units (specs only: no weights are allocated; each block
// builds its rotary table, seq_len x hs floats). parameter_count of it is
// llama_parameter_count.
Model make_llama(const LlamaConfig& config);

// The (B T, V) fp32 logits of `tokens` (B, T) under `weights` (one flat buffer per unit of
// make_llama(config)): the embedding and the blocks run forward as units with fp32 products,
// then the final RMSNorm and lm_head's product over every row at once (no loss). For reference
// checks and sampling without a cache; the head unit's loss is the cross-entropy of these
// logits within fp32 rounding (its products run in blocks of rows). Throws InvalidArgument on
// a shape or buffer that does not fit the model, or a token outside [0, vocab).
std::vector<float> llama_logits(const LlamaConfig& config,
                                std::span<const std::vector<float>> weights,
                                std::span<const int32_t> tokens, int B, int T);

}  // namespace zerodp
