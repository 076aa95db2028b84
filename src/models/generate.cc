// Generation: the units' forward over a sliding window, logits for the last position, and
// a portable categorical draw.
#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"
#include "nn/layers.h"

namespace zerodp {

void check_weight_layout(std::string_view kind, int layers, const Model& model,
                         std::span<const std::vector<float>> weights) {
  if (weights.size() != model.size()) {
    throw InvalidArgument(fmt::format(
        "generate: {} weight buffers given; a {} with {} layers has {} units (embedding, "
        "h.0..h.{}, head)",
        weights.size(), kind, layers, model.size(), layers - 1));
  }
  for (size_t u = 0; u < model.size(); ++u) {
    if (weights[u].size() != model[u]->numel()) {
      throw InvalidArgument(
          fmt::format("generate: weights of unit {} hold {} elements; the unit has {}",
                      model[u]->name(), weights[u].size(), model[u]->numel()));
    }
  }
}

namespace {

// The one tensor `name` of unit `u`, as a view of its flat buffer.
std::span<const float> tensor_view(const Unit& u, std::span<const float> w, std::string_view name) {
  for (const TensorSpec& t : u.tensors()) {
    if (t.name == name) return w.subspan(t.offset, t.numel);
  }
  throw InvalidArgument(fmt::format("unit {} has no tensor {}", u.name(), name));
}

}  // namespace

void validate(const GenerateOptions& options, const GptConfig& config) {
  validate(options, config.vocab);
}

void validate(const GenerateOptions& options, int vocab) {
  if (options.max_tokens < 0) {
    throw InvalidArgument(
        fmt::format("max_tokens is {}; it must be 0 or more", options.max_tokens));
  }
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature)) {
    throw InvalidArgument(fmt::format(
        "temperature is {}; it must be a finite number >= 0 (0 = greedy, 1 = the model's "
        "distribution)",
        options.temperature));
  }
  if (options.top_k < 0 || options.top_k > vocab) {
    throw InvalidArgument(fmt::format(
        "top_k is {}; it must be 0 (every token) or 1..{} (the vocabulary)", options.top_k, vocab));
  }
  if (options.eos && (*options.eos < 0 || *options.eos >= vocab)) {
    throw InvalidArgument(fmt::format("eos is {}; it must be a token of the vocabulary, 0..{}",
                                      *options.eos, vocab - 1));
  }
}

std::vector<int32_t> prompt_tokens(std::string_view prompt, int vocab) {
  std::vector<int32_t> context;
  context.reserve(prompt.size() + 1);
  if (prompt.empty()) context.push_back('\n');
  for (size_t i = 0; i < prompt.size(); ++i) {
    const int32_t byte = static_cast<unsigned char>(prompt[i]);
    if (byte >= vocab) {
      throw InvalidArgument(fmt::format(
          "prompt byte {} at offset {} is outside the model's vocabulary of {}; give a prompt "
          "of bytes below {}",
          byte, i, vocab, vocab));
    }
    context.push_back(byte);
  }
  return context;
}

std::vector<int32_t> generate_ids(
    std::vector<int32_t> context, const GenerateOptions& options, int vocab,
    const std::function<std::vector<float>(std::span<const int32_t>)>& next_logits,
    const std::function<void(int32_t)>& on_token) {
  validate(options, vocab);
  context.reserve(context.size() + static_cast<size_t>(options.max_tokens));
  GenerateRng rng(options.seed);
  std::vector<int32_t> out;
  for (int i = 0; i < options.max_tokens; ++i) {
    const std::vector<float> logits = next_logits(context);
    const uint64_t draw = options.temperature > 0 ? rng.next() : 0;
    const int32_t token = pick_token(logits, options.temperature, options.top_k, draw);
    if (options.eos && token == *options.eos) break;
    context.push_back(token);
    out.push_back(token);
    if (on_token) on_token(token);
  }
  return out;
}

std::string generate_text(
    std::string_view who, std::string_view prompt, const GenerateOptions& options, int vocab,
    const std::function<std::vector<float>(std::span<const int32_t>)>& next_logits,
    const std::function<void(char)>& on_byte) {
  if (vocab > 256) {
    throw InvalidArgument(fmt::format(
        "{}: vocab is {}; generation writes bytes, so it needs vocab <= 256 (or a tokenizer: "
        "zerodp sample --tokenizer)",
        who, vocab));
  }
  validate(options, vocab);
  std::string out;
  generate_ids(prompt_tokens(prompt, vocab), options, vocab, next_logits, [&](int32_t token) {
    out.push_back(static_cast<char>(static_cast<unsigned char>(token)));
    if (on_byte) on_byte(out.back());
  });
  return out;
}

Generator::Generator(const GptConfig& config, std::span<const std::vector<float>> weights)
    : config_(config), model_(make_gpt(config)), weights_(weights) {
  check_weight_layout("gpt", config_.layers, model_, weights_);
}

std::optional<NonFiniteWeight> find_non_finite(const GptConfig& config,
                                               std::span<const std::vector<float>> weights) {
  const Model model = make_gpt(config);
  check_weight_layout("gpt", config.layers, model, weights);
  return find_non_finite(model, weights);
}

std::optional<NonFiniteWeight> find_non_finite(const Model& model,
                                               std::span<const std::vector<float>> weights) {
  for (size_t u = 0; u < model.size() && u < weights.size(); ++u) {
    for (const TensorSpec& t : model[u]->tensors()) {
      if (t.offset + t.numel > weights[u].size()) continue;  // the caller checks the layout
      const auto values = std::span<const float>(weights[u]).subspan(t.offset, t.numel);
      const auto bad =
          std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
      if (bad != values.end()) {
        return NonFiniteWeight{t.name, static_cast<size_t>(bad - values.begin()), *bad};
      }
    }
  }
  return std::nullopt;
}

namespace {

// The embedding and every block of a gpt over `window` (B = 1), the units' own forward in
// fp32; the stream of the last block is left in `a`. The buffers are (re)sized for the
// window's length when it is not `T`.
void run_gpt_window(const Model& model, std::span<const std::vector<float>> weights,
                    std::span<const int32_t> window, int& T, std::vector<float>& a,
                    std::vector<float>& b, std::vector<float>& saved, std::vector<float>& scratch) {
  const size_t seen = window.size();
  const BatchShape shape{1, static_cast<int>(seen)};
  const Unit& embedding = *model.front();
  if (shape.T != T) {
    // Every block has the same counts; the head's input is the stream.
    const size_t stream = embedding.output_count(shape);
    size_t saved_n = 0, scratch_n = 0;
    for (size_t u = 1; u + 1 < model.size(); ++u) {
      saved_n = std::max(saved_n, model[u]->saved_count(shape, GemmCompute::kFP32));
      scratch_n = std::max(scratch_n, model[u]->scratch_count(shape));
    }
    a.assign(stream, 0.0f);
    b.assign(stream, 0.0f);
    saved.assign(saved_n, 0.0f);
    scratch.assign(scratch_n, 0.0f);
    T = shape.T;
  }
  MicroBatch mb;
  mb.shape = shape;
  mb.tokens = window;

  // Sampling multiplies in fp32.
  const auto weights_of = [&](size_t u) { return UnitWeights::fp32(weights[u]); };
  model.front()->forward(weights_of(0), {}, a, {}, {}, mb);
  for (size_t u = 1; u + 1 < model.size(); ++u) {
    model[u]->forward(
        weights_of(u), a, b,
        std::span<float>(saved).first(model[u]->saved_count(shape, GemmCompute::kFP32)), scratch,
        mb);
    std::swap(a, b);
  }
}

}  // namespace

std::span<const int32_t> context_window(std::span<const int32_t> context, int seq_len, int vocab) {
  if (context.empty()) {
    throw InvalidArgument("next_token_logits: the context is empty; give at least one token");
  }
  const auto window = context.last(std::min(context.size(), static_cast<size_t>(seq_len)));
  for (size_t i = 0; i < window.size(); ++i) {
    if (window[i] < 0 || window[i] >= vocab) {
      throw InvalidArgument(
          fmt::format("next_token_logits: token {} at position {} of the window is outside "
                      "[0, {})",
                      window[i], i, vocab));
    }
  }
  return window;
}

std::vector<float> Generator::next_token_logits(std::span<const int32_t> context) {
  const auto window = context_window(context, config_.seq_len, config_.vocab);
  const size_t seen = window.size();
  run_gpt_window(model_, weights_, window, T_, stream_a_, stream_b_, saved_, scratch_);
  const Unit& head = *model_.back();

  // ln_f then lm_head on the last row: the head unit's forward would compute every row and
  // reduce them to a loss.
  const size_t C = static_cast<size_t>(config_.embd), V = static_cast<size_t>(config_.vocab);
  const std::span<const float> w_head = weights_.back();
  const auto last = std::span<const float>(stream_a_).subspan((seen - 1) * C, C);
  std::vector<float> lnf(C), logits(V);
  float mean = 0.0f, rstd = 0.0f;
  layernorm_forward(lnf, std::span<float>(&mean, 1), std::span<float>(&rstd, 1), last,
                    tensor_view(head, w_head, "ln_f.weight"),
                    tensor_view(head, w_head, "ln_f.bias"), 1, C);
  linear_forward(logits, lnf, tensor_view(head, w_head, "lm_head.weight"), {}, 1, C, V,
                 GemmCompute::kFP32);
  return logits;
}

std::vector<float> gpt_logits(const GptConfig& config, std::span<const std::vector<float>> weights,
                              std::span<const int32_t> tokens) {
  const Model model = make_gpt(config);
  check_weight_layout("gpt", config.layers, model, weights);
  if (tokens.empty() || tokens.size() > static_cast<size_t>(config.seq_len)) {
    throw InvalidArgument(fmt::format("gpt_logits: {} tokens given; a gpt sees 1..seq_len={}",
                                      tokens.size(), config.seq_len));
  }
  int T = 0;
  std::vector<float> a, b, saved, scratch;
  run_gpt_window(model, weights, tokens, T, a, b, saved, scratch);  // the embedding checks tokens
  const Unit& head = *model.back();
  const std::span<const float> w_head = weights.back();
  const size_t rows = tokens.size(), C = static_cast<size_t>(config.embd),
               V = static_cast<size_t>(config.vocab);
  std::vector<float> lnf(rows * C), mean(rows), rstd(rows), logits(rows * V);
  layernorm_forward(lnf, mean, rstd, a, tensor_view(head, w_head, "ln_f.weight"),
                    tensor_view(head, w_head, "ln_f.bias"), rows, C);
  linear_forward(logits, lnf, tensor_view(head, w_head, "lm_head.weight"), {}, rows, C, V,
                 GemmCompute::kFP32);
  return logits;
}

std::string Generator::generate(std::string_view prompt, const GenerateOptions& options,
                                const std::function<void(char)>& on_byte) {
  return generate_text(
      "gpt", prompt, options, config_.vocab,
      [&](std::span<const int32_t> context) { return next_token_logits(context); }, on_byte);
}

int32_t pick_token(std::span<const float> logits, double temperature, int top_k, uint64_t draw) {
  const size_t V = logits.size();
  if (V == 0) throw InvalidArgument("pick_token: the logits are empty");
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    throw InvalidArgument(
        fmt::format("pick_token: temperature is {}; it must be a finite number >= 0", temperature));
  }
  if (top_k < 0 || static_cast<size_t>(top_k) > V) {
    throw InvalidArgument(fmt::format("pick_token: top_k is {}; it must be 0 or 1..{}", top_k, V));
  }
  for (size_t i = 0; i < V; ++i) {
    if (!std::isfinite(logits[i])) {
      throw InvalidArgument(fmt::format(
          "pick_token: logit {} is {}; the model's weights or activations are not finite", i,
          logits[i]));
    }
  }
  // Strictly greater keeps the lowest index among ties.
  const auto argmax = [&] {
    size_t best = 0;
    for (size_t i = 1; i < V; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return static_cast<int32_t>(best);
  };
  if (temperature == 0 || top_k == 1) return argmax();

  // The kept tokens, in ascending index order (the order of the sums below).
  std::vector<size_t> kept(V);
  std::iota(kept.begin(), kept.end(), size_t{0});
  if (top_k > 0 && static_cast<size_t>(top_k) < V) {
    const auto larger = [&](size_t a, size_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    };
    std::nth_element(kept.begin(), kept.begin() + (top_k - 1), kept.end(), larger);
    kept.resize(static_cast<size_t>(top_k));
    std::sort(kept.begin(), kept.end());
  }
  double max_scaled = -INFINITY;
  for (size_t i : kept)
    max_scaled = std::max(max_scaled, static_cast<double>(logits[i]) / temperature);
  std::vector<double> weight(kept.size());
  double total = 0;
  for (size_t j = 0; j < kept.size(); ++j) {
    weight[j] = std::exp(static_cast<double>(logits[kept[j]]) / temperature - max_scaled);
    total += weight[j];
  }
  const double u = static_cast<double>(draw >> 11) * 0x1.0p-53;
  const double target = u * total;
  double running = 0;
  size_t last_positive = 0;
  for (size_t j = 0; j < kept.size(); ++j) {
    running += weight[j];
    if (weight[j] > 0) last_positive = j;
    if (target < running) return static_cast<int32_t>(kept[j]);
  }
  // u * total can round up to total itself; the draw then belongs to the last token that
  // has any weight.
  return static_cast<int32_t>(kept[last_positive]);
}

std::string generate(const GptConfig& config, std::span<const std::vector<float>> weights,
                     std::string_view prompt, const GenerateOptions& options) {
  return Generator(config, weights).generate(prompt, options);
}

}  // namespace zerodp
