// Text generation from a trained model, bytes in, bytes out: the gpt (models/gpt.h,
// Generator below) and the llama (models/llama.h, LlamaGenerator, with a KV cache). Both draw
// every token the same way (pick_token, GenerateRng) and share one decoding loop
// (generate_text), so a family only says how it computes the next token's logits.
//
// The weights are one fp32 flat buffer per unit of make_gpt(config) / make_llama(config),
// laid out by the units' TensorSpecs (what the engine trains and `zerodp export` writes).
//
// The gpt: each new token runs the embedding and every block through the units' own forward
// on the last min(length, seq_len) tokens (B = 1, no KV cache: a token costs a full forward of
// the window), then ln_f and lm_head on the last position only; the training head is not used,
// so its behaviour (a loss, not logits) stays as it is.
//
// The llama: the same window, the last min(length, seq_len) tokens at rotary positions
// 0..W-1, with a KV cache: per block, the rotated keys and the values of every position of the
// window so far (kv_heads x hs floats each, not repeated to the query heads). A token that
// extends the cached window runs one row through the blocks: RMSNorm, the q/k/v product, the
// rotation at its position (the blocks' own pinned RopeTable, through rope_qkv_forward), the
// one query row's attention over the cached keys (query head h reads kv head
// h / (heads / kv_heads)), o_proj, residual, RMSNorm, gate/up, SwiGLU, down_proj, residual;
// then the final RMSNorm and lm_head on that row. All fp32. Past the context length the window
// slides as the gpt's does, and a window that slid starts at position 0 again, so every cached
// key is at the wrong position: the cache is dropped and rebuilt from scratch over the new
// window (its seq_len tokens as one batch through the blocks, the attention kernel's forward).
// So past seq_len each token costs a full-window forward, as without a cache; within it, one
// row per token. The logits equal llama_logits' last row of the window within fp32 rounding
// (the products see other row counts, so the bits may differ).
//
// Sampling follows nanoGPT's sample.py: logits / temperature, keep the top_k largest,
// softmax, draw. Two choices are zerodp's own and are stated so that another
// implementation can reproduce the bytes:
// - temperature 0 is greedy: the argmax, ties to the lowest index, and no random draw.
// - top_k keeps exactly k tokens: the k largest logits, ties at the boundary to the lowest
//   indices (nanoGPT keeps every token tied with the k-th), so top_k = 1 is greedy.
// Randomness: generated token i (0-based) uses the i-th output of splitmix64 seeded with
// `seed` (state += 0x9e3779b97f4a7c15, output = the splitmix64 finalizer of the state),
// turned into u = (draw >> 11) * 2^-53 in [0, 1). The softmax is computed in double over the
// kept tokens in ascending index order, w_i = exp(l_i / temperature - max), and the token is
// the first whose running sum of w exceeds u * sum(w). Only integer arithmetic, IEEE double
// division and std::exp are involved, so a seed gives the same bytes on every platform for
// the same logits (the logits themselves depend on the CPU's kernels; docs/architecture.md).
// An end-of-sequence token (GenerateOptions::eos), when drawn, ends the text: it is neither
// returned nor shown, and nothing is drawn after it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/gpt.h"
#include "models/llama.h"
#include "models/model.h"
#include "nn/layers.h"

namespace zerodp {

struct GenerateOptions {
  int max_tokens = 256;      // bytes to generate, >= 0
  double temperature = 1.0;  // >= 0 and finite; 0 = greedy
  int top_k = 0;             // 0 = every token; otherwise 1..vocab
  uint64_t seed = 1337;
  // A token that ends the text when drawn (not returned); none by default: a byte vocabulary
  // has no end-of-sequence token. Otherwise 0..vocab-1.
  std::optional<int32_t> eos = std::nullopt;
};

// Throws InvalidArgument naming the option, its value and what would work, for a model of
// `vocab` tokens.
void validate(const GenerateOptions& options, int vocab);
void validate(const GenerateOptions& options, const GptConfig& config);

// The tokens generation starts from: the prompt's bytes, or "\n" for an empty prompt (the byte
// that begins a line, as a fresh document would). Throws InvalidArgument naming the first byte
// outside [0, vocab) and its offset.
std::vector<int32_t> prompt_tokens(std::string_view prompt, int vocab);

// One buffer per unit of `model`, each of the unit's length; InvalidArgument naming the unit
// and both lengths otherwise (`kind` and `layers` name the model in the message).
void check_weight_layout(std::string_view kind, int layers, const Model& model,
                         std::span<const std::vector<float>> weights);

// The last `seq_len` tokens of `context`, the window a model sees; InvalidArgument for an
// empty context or a token outside [0, vocab), naming it and its position in the window.
std::span<const int32_t> context_window(std::span<const int32_t> context, int seq_len, int vocab);

// The decoding loop over token ids, any vocabulary (a tokenizer's): up to
// `options.max_tokens` ids continuing `context`, each drawn by pick_token from
// next_logits(the context so far) and handed to `on_token`; stops early at options.eos (not
// returned). Checks `options` (validate).
std::vector<int32_t> generate_ids(
    std::vector<int32_t> context, const GenerateOptions& options, int vocab,
    const std::function<std::vector<float>(std::span<const int32_t>)>& next_logits,
    const std::function<void(int32_t)>& on_token);

// The same loop over bytes, as every family's generate() runs it: up to `options.max_tokens` bytes
// continuing prompt_tokens(prompt, vocab), each drawn by pick_token from next_logits(the context so
// far), the context growing by one token a step; stops early at options.eos (not returned). Checks
// `options` (validate) and that vocab <= 256, as `who` ("gpt", "llama"): text is bytes.
std::string generate_text(
    std::string_view who, std::string_view prompt, const GenerateOptions& options, int vocab,
    const std::function<std::vector<float>(std::span<const int32_t>)>& next_logits,
    const std::function<void(char)>& on_byte);

// Holds a gpt and borrows its weights (the caller keeps them alive and unchanged). It owns
// the activation buffers it reuses between calls, so one thread uses it at a time.
class Generator {
 public:
  // Throws InvalidArgument for a bad config (validate(GptConfig)) or weights that do not
  // match make_gpt(config): the wrong number of units, or a unit whose buffer length differs
  // (naming the unit and both lengths). Any vocabulary: generate() refuses one above 256.
  Generator(const GptConfig& config, std::span<const std::vector<float>> weights);

  const GptConfig& config() const { return config_; }

  // The next-token logits (vocab) after `context`, of which only the last seq_len tokens
  // are seen. Throws InvalidArgument for an empty context or a token outside [0, vocab).
  std::vector<float> next_token_logits(std::span<const int32_t> context);

  // `max_tokens` bytes continuing `prompt`, without the prompt. An empty prompt starts from
  // "\n" (the byte that begins a line, as a fresh document would), which is not returned
  // either. Throws InvalidArgument for bad options or a prompt byte outside the vocabulary.
  // `on_byte`, when given, sees each byte as soon as it is chosen (a large model takes a
  // while per byte, and a terminal should not wait for all of them).
  std::string generate(std::string_view prompt, const GenerateOptions& options,
                       const std::function<void(char)>& on_byte = {});

 private:
  GptConfig config_;
  Model model_;
  std::span<const std::vector<float>> weights_;
  // Activation buffers for the current window length, resized when it changes.
  int T_ = 0;
  std::vector<float> stream_a_, stream_b_, saved_, scratch_;
};

// Where weights laid out by make_gpt(config) first hold a NaN or an infinity: the tensor
// (canonical name), the element within it and its value. A model with one non-finite weight
// gives non-finite logits for every context, so a loader checks this once, up front, and
// names the tensor instead of failing at the first token. Throws InvalidArgument as
// Generator does for weights that do not match the config.
struct NonFiniteWeight {
  std::string tensor;
  size_t element = 0;
  float value = 0;
};
std::optional<NonFiniteWeight> find_non_finite(const GptConfig& config,
                                               std::span<const std::vector<float>> weights);
// The same for a llama (the layout checked as LlamaGenerator checks it), and for any model
// whose layout the caller has checked (one buffer per unit, each of the unit's length).
std::optional<NonFiniteWeight> find_non_finite(const LlamaConfig& config,
                                               std::span<const std::vector<float>> weights);
std::optional<NonFiniteWeight> find_non_finite(const Model& model,
                                               std::span<const std::vector<float>> weights);

// The (T, V) fp32 logits of a gpt over `tokens` (T of them, 1 <= T <= seq_len), row-major:
// the units' forward as the Generator runs it, then ln_f and lm_head over every row. Any
// vocabulary (no bytes are written). Throws InvalidArgument as Generator does for a bad
// config or weights, for T outside 1..seq_len and for a token outside [0, vocab).
std::vector<float> gpt_logits(const GptConfig& config, std::span<const std::vector<float>> weights,
                              std::span<const int32_t> tokens);

// One token from `logits` by the rules above, with `draw` the 64-bit random value (unused
// when temperature is 0). Throws InvalidArgument for empty or non-finite logits, a negative
// or non-finite temperature, or top_k outside 0..logits.size().
int32_t pick_token(std::span<const float> logits, double temperature, int top_k, uint64_t draw);

// The generator's random sequence: the i-th call returns the i-th draw for `seed`.
class GenerateRng {
 public:
  explicit GenerateRng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// Convenience: Generator(config, weights).generate(prompt, options).
std::string generate(const GptConfig& config, std::span<const std::vector<float>> weights,
                     std::string_view prompt, const GenerateOptions& options);

// Holds a llama and borrows its weights (as Generator does); owns the KV cache and the
// buffers it reuses between calls, so one thread uses it at a time. Implemented in
// llama_generate.cc.
class LlamaGenerator {
 public:
  // kOn: the KV cache above. kOff: every token recomputes the whole window with llama_logits
  // (for checking the cache; the same logits within fp32 rounding).
  enum class Cache : bool { kOff = false, kOn = true };

  // Throws InvalidArgument for a bad config (validate(LlamaConfig)) or weights that do not
  // match make_llama(config): the wrong number of units, or a unit whose buffer length differs
  // (naming the unit and both lengths). Any vocabulary: generate() refuses one above 256.
  LlamaGenerator(const LlamaConfig& config, std::span<const std::vector<float>> weights,
                 Cache cache = Cache::kOn);

  const LlamaConfig& config() const { return config_; }

  // The next-token logits (vocab) after `context`, of which only the last seq_len tokens are
  // seen, at positions 0..; with the cache, the rows of the window not cached yet run through
  // the blocks (one when the context grew by one token within seq_len), and a window that is
  // not the cached one extended (it slid, or another context) rebuilds the cache from
  // scratch. Throws InvalidArgument for an empty context or a token outside [0, vocab).
  std::vector<float> next_token_logits(std::span<const int32_t> context);

  // As Generator::generate. Throws InvalidArgument for a vocabulary above 256 (generation
  // writes bytes), bad options or a prompt byte outside the vocabulary.
  std::string generate(std::string_view prompt, const GenerateOptions& options,
                       const std::function<void(char)>& on_byte = {});

  // What the cache did since construction: rows run through the blocks, and how often a
  // cached window was dropped and rebuilt from position 0 (each token past seq_len).
  struct Counters {
    uint64_t rows = 0;
    uint64_t rebuilds = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Layer {  // views of one block's weights
    std::span<const float> norm1, qkv, o, norm2, gate_up, down;
  };
  // Runs window rows [from, W) through the blocks at positions from.., the cache holding
  // rows [0, from); leaves the last row's logits in logits_.
  void run_rows(std::span<const int32_t> window, size_t from);
  void attend_cached(size_t layer, size_t from, size_t rows);

  LlamaConfig config_;
  std::span<const std::vector<float>> weights_;
  Cache cache_mode_;
  size_t C_ = 0, NH_ = 0, KVH_ = 0, HS_ = 0, KV_ = 0, F_ = 0, V_ = 0, P_ = 0;
  RopeTable rope_;  // the blocks' table: seq_len positions
  std::span<const float> wte_, norm_f_, lm_head_;
  std::vector<Layer> layers_;
  // The cache: per block, (seq_len, kv_heads, hs) rotated keys and values; its first
  // cached_.size() positions hold the window cached_.
  std::vector<std::vector<float>> k_cache_, v_cache_;
  std::vector<int32_t> cached_;
  std::vector<float> logits_;  // the last cached row's
  // Activations for `rows` rows, resized as needed.
  std::vector<float> x_, x_next_, xn_, rstd_, proj_, qkv_, att_, branch_, res2_, gate_up_, act_,
      att_saved_, att_scratch_, scores_;
  Counters counters_;
};

}  // namespace zerodp
