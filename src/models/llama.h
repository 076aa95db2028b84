// The `llama` family's shape (issue 48): what a Llama-shaped model is made of, before the
// model itself. RMSNorm (eps), rotary positions in the rotate-half order (theta), SwiGLU
// (gate, up, down of `ffn` hidden units), grouped-query attention (`kv_heads` dividing
// `heads`), no biases, an untied head. The layers are nn/layers.h's; the units that train them
// come with the model.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

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

}  // namespace zerodp
