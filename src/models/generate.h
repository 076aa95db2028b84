// Text generation from a trained gpt (models/gpt.h): bytes in, bytes out.
//
// The weights are one fp32 flat buffer per unit of make_gpt(config), laid out by the
// units' TensorSpecs (what the engine trains and `zerodp export` writes). Each new token
// runs the embedding and every block through the units' own forward on the last
// min(length, seq_len) tokens (B = 1, no KV cache: a token costs a full forward of the
// window), then ln_f and lm_head on the last position only; the training head is not used,
// so its behaviour (a loss, not logits) stays as it is.
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
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/gpt.h"

namespace zerodp {

struct GenerateOptions {
  int max_tokens = 256;      // bytes to generate, >= 0
  double temperature = 1.0;  // >= 0 and finite; 0 = greedy
  int top_k = 0;             // 0 = every token; otherwise 1..vocab
  uint64_t seed = 1337;
};

// Throws InvalidArgument naming the option, its value and what would work.
void validate(const GenerateOptions& options, const GptConfig& config);

// Holds a gpt and borrows its weights (the caller keeps them alive and unchanged). It owns
// the activation buffers it reuses between calls, so one thread uses it at a time.
class Generator {
 public:
  // Throws InvalidArgument for a bad config (validate(GptConfig)), a vocabulary above 256
  // (tokens are bytes), or weights that do not match make_gpt(config): the wrong number of
  // units, or a unit whose buffer length differs (naming the unit and both lengths).
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

}  // namespace zerodp
