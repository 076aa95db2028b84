// Generation from a llama with a KV cache (models/generate.h says what is computed; this file
// how).
//
// Decisions a reader could not guess from the interface:
//
// * The cache is keyed by the window's tokens, not by calls: next_token_logits compares the
//   window (the context's last min(length, seq_len) tokens) with the tokens cached, and runs
//   only the rows past them when the cached window is its prefix. Anything else (the window
//   slid past seq_len, or another context altogether) drops the cache and runs the whole
//   window from position 0. So a caller cannot get stale keys, whatever order it asks in.
// * A window run from position 0 (the prompt, and every rebuild) goes through the blocks'
//   own kernels as one batch: rope_qkv_forward with the blocks' table and attention_forward,
//   then the rotated k and v of each group's first head are copied into the cache. Rows added
//   to a cached window are rotated by rope_qkv_forward too, through a one-position table whose
//   row is the pinned table's row at their position (the same cos and sin bits), and attend
//   with the loop below: scores = q.k / sqrt(hs) over the cached positions, softmax, the sum
//   of the values, each in fp32 in position order.
// * The cache holds kv_heads x hs floats per position and block for k and as many for v
//   (2 layers x seq_len x kv_heads x hs floats in all: 92 MB for the 1.1b preset), allocated
//   once at construction.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "models/generate.h"
#include "nn/attention.h"
#include "nn/layers.h"

namespace zerodp {
namespace {

// The tensor `name` of `unit`'s buffer, or InvalidArgument (a model built by make_llama has
// every one).
std::span<const float> tensor_of(const Unit& unit, std::span<const float> w,
                                 const std::string& name) {
  for (const TensorSpec& t : unit.tensors()) {
    if (t.name == name) return w.subspan(t.offset, t.numel);
  }
  throw InvalidArgument(fmt::format("llama generate: unit {} has no tensor {}", unit.name(), name));
}

// Tensors consecutive in one flat buffer, as one matrix (q, k, v; gate, up).
std::span<const float> joined(std::initializer_list<std::span<const float>> parts) {
  const std::span<const float> first = *parts.begin();
  size_t n = 0;
  for (const auto& p : parts) {
    if (p.data() != first.data() + n) {
      throw InvalidArgument("llama generate: the q/k/v or gate/up weights are not consecutive");
    }
    n += p.size();
  }
  return {first.data(), n};
}

}  // namespace

LlamaGenerator::LlamaGenerator(const LlamaConfig& config,
                               std::span<const std::vector<float>> weights, Cache cache)
    : config_(config), weights_(weights), cache_mode_(cache) {
  const Model model = make_llama(config);  // validates the config
  check_weight_layout("llama", config.layers, model, weights);
  C_ = static_cast<size_t>(config.embd);
  NH_ = static_cast<size_t>(config.heads);
  KVH_ = static_cast<size_t>(config.kv_heads);
  HS_ = static_cast<size_t>(config.head_size());
  KV_ = KVH_ * HS_;
  F_ = static_cast<size_t>(config.ffn);
  V_ = static_cast<size_t>(config.vocab);
  P_ = C_ + 2 * KV_;
  rope_ = rope_table(static_cast<size_t>(config.seq_len), HS_, config.rope_theta);
  const auto w = [&](size_t u) { return std::span<const float>(weights[u]); };
  wte_ = tensor_of(*model.front(), w(0), "model.embed_tokens.weight");
  norm_f_ = tensor_of(*model.back(), w(model.size() - 1), "model.norm.weight");
  lm_head_ = tensor_of(*model.back(), w(model.size() - 1), "lm_head.weight");
  for (int i = 0; i < config.layers; ++i) {
    const Unit& unit = *model[static_cast<size_t>(i) + 1];
    const std::span<const float> b = w(static_cast<size_t>(i) + 1);
    const std::string p = fmt::format("model.layers.{}.", i);
    const auto t = [&](const char* name) { return tensor_of(unit, b, p + name); };
    layers_.push_back(Layer{
        .norm1 = t("input_layernorm.weight"),
        .qkv = joined({t("self_attn.q_proj.weight"), t("self_attn.k_proj.weight"),
                       t("self_attn.v_proj.weight")}),
        .o = t("self_attn.o_proj.weight"),
        .norm2 = t("post_attention_layernorm.weight"),
        .gate_up = joined({t("mlp.gate_proj.weight"), t("mlp.up_proj.weight")}),
        .down = t("mlp.down_proj.weight"),
    });
  }
  if (cache_mode_ == Cache::kOn) {
    const size_t per_layer = static_cast<size_t>(config.seq_len) * KV_;
    k_cache_.assign(layers_.size(), std::vector<float>(per_layer));
    v_cache_.assign(layers_.size(), std::vector<float>(per_layer));
  }
}

std::vector<float> LlamaGenerator::next_token_logits(std::span<const int32_t> context) {
  const auto window = context_window(context, config_.seq_len, config_.vocab);
  const size_t seen = window.size();
  if (cache_mode_ == Cache::kOff) {
    const std::vector<float> all =
        llama_logits(config_, weights_, window, 1, static_cast<int>(seen));
    counters_.rows += seen;
    return {all.end() - static_cast<std::ptrdiff_t>(V_), all.end()};
  }
  const size_t cached = cached_.size();
  const bool extends =
      cached > 0 && cached <= seen && std::equal(cached_.begin(), cached_.end(), window.begin());
  if (extends && cached == seen) return logits_;
  if (!extends && cached > 0) ++counters_.rebuilds;
  run_rows(window, extends ? cached : 0);
  return logits_;
}

void LlamaGenerator::run_rows(std::span<const int32_t> window, size_t from) {
  const size_t rows = window.size() - from, C = C_, F = F_, P = P_;
  cached_.assign(window.begin(), window.begin() + static_cast<std::ptrdiff_t>(from));
  const auto fit = [&](std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return std::span<float>(v).first(n);
  };
  auto x = fit(x_, rows * C), x_next = fit(x_next_, rows * C);
  const auto xn = fit(xn_, rows * C), rstd = fit(rstd_, rows), proj = fit(proj_, rows * P),
             qkv = fit(qkv_, rows * 3 * C), att = fit(att_, rows * C),
             branch = fit(branch_, rows * C), res2 = fit(res2_, rows * C),
             gate_up = fit(gate_up_, rows * 2 * F), act = fit(act_, rows * F);
  const auto tokens = window.subspan(from);
  embedding_forward(x, tokens, wte_, 1, rows, C, V_);
  const AttentionDims dims{.B = 1, .T = rows, .C = C, .NH = NH_};
  const size_t group = NH_ / KVH_;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    rmsnorm_forward(xn, rstd, x, w.norm1, rows, C, config_.norm_eps);
    linear_forward(proj, xn, w.qkv, {}, rows, C, P, GemmCompute::kFP32);
    if (from == 0) {
      // The whole window: the blocks' kernels.
      rope_qkv_forward(qkv, proj, rope_, 1, rows, NH_, KVH_, HS_);
      attention_forward(att, fit(att_saved_, attention_saved_count(dims)),
                        fit(att_scratch_, attention_scratch_count(dims)), qkv, dims,
                        GemmCompute::kFP32);
    } else {
      RopeTable at{.max_T = 1, .half = rope_.half, .cos = {}, .sin = {}};
      for (size_t r = 0; r < rows; ++r) {
        const auto row = (from + r) * rope_.half;
        at.cos.assign(rope_.cos.begin() + static_cast<std::ptrdiff_t>(row),
                      rope_.cos.begin() + static_cast<std::ptrdiff_t>(row + rope_.half));
        at.sin.assign(rope_.sin.begin() + static_cast<std::ptrdiff_t>(row),
                      rope_.sin.begin() + static_cast<std::ptrdiff_t>(row + rope_.half));
        rope_qkv_forward(qkv.subspan(r * 3 * C, 3 * C), proj.subspan(r * P, P), at, 1, 1, NH_, KVH_,
                         HS_);
      }
    }
    // The new positions' rotated k and v: each group's first head in the packed rows.
    for (size_t r = 0; r < rows; ++r) {
      const float* packed = qkv.data() + r * 3 * C;
      float* k = k_cache_[l].data() + (from + r) * KV_;
      float* v = v_cache_[l].data() + (from + r) * KV_;
      for (size_t g = 0; g < KVH_; ++g) {
        std::copy_n(packed + C + g * group * HS_, HS_, k + g * HS_);
        std::copy_n(packed + 2 * C + g * group * HS_, HS_, v + g * HS_);
      }
    }
    if (from > 0) attend_cached(l, from, rows);
    linear_forward(branch, att, w.o, {}, rows, C, C, GemmCompute::kFP32);
    residual_forward(res2, x, branch);
    rmsnorm_forward(xn, rstd, res2, w.norm2, rows, C, config_.norm_eps);
    linear_forward(gate_up, xn, w.gate_up, {}, rows, C, 2 * F, GemmCompute::kFP32);
    swiglu_rows_forward(act, gate_up, rows, F);
    linear_forward(branch, act, w.down, {}, rows, F, C, GemmCompute::kFP32);
    residual_forward(x_next, res2, branch);
    std::swap(x, x_next);
  }
  // The final RMSNorm and lm_head on the last row.
  std::vector<float> last_norm(C);
  float last_rstd = 0;
  rmsnorm_forward(last_norm, std::span<float>(&last_rstd, 1), x.last(C), norm_f_, 1, C,
                  config_.norm_eps);
  logits_.resize(V_);
  linear_forward(logits_, last_norm, lm_head_, {}, 1, C, V_, GemmCompute::kFP32);
  cached_.assign(window.begin(), window.end());
  counters_.rows += rows;
}

// Rows [from, from + rows) of att from their queries (qkv's first C of each packed row) over
// the cached keys and values of positions 0..their own.
void LlamaGenerator::attend_cached(size_t layer, size_t from, size_t rows) {
  const size_t C = C_, HS = HS_, group = NH_ / KVH_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const float* keys = k_cache_[layer].data();
  const float* values = v_cache_[layer].data();
  if (scores_.size() < from + rows) scores_.resize(from + rows);
  for (size_t r = 0; r < rows; ++r) {
    const size_t n = from + r + 1;  // positions 0..from + r
    for (size_t h = 0; h < NH_; ++h) {
      const float* q = qkv_.data() + r * 3 * C + h * HS;
      const size_t g = h / group;
      float max = -INFINITY;
      for (size_t j = 0; j < n; ++j) {
        const float* k = keys + j * KV_ + g * HS;
        float dot = 0;
        for (size_t i = 0; i < HS; ++i) dot += q[i] * k[i];
        scores_[j] = dot * scale;
        max = std::max(max, scores_[j]);
      }
      float sum = 0;
      for (size_t j = 0; j < n; ++j) {
        scores_[j] = std::exp(scores_[j] - max);
        sum += scores_[j];
      }
      const float inv = 1.0f / sum;
      float* y = att_.data() + r * C + h * HS;
      std::fill_n(y, HS, 0.0f);
      for (size_t j = 0; j < n; ++j) {
        const float p = scores_[j] * inv;
        const float* v = values + j * KV_ + g * HS;
        for (size_t i = 0; i < HS; ++i) y[i] += p * v[i];
      }
    }
  }
}

std::string LlamaGenerator::generate(std::string_view prompt, const GenerateOptions& options,
                                     const std::function<void(char)>& on_byte) {
  return generate_text(
      "llama", prompt, options, config_.vocab,
      [&](std::span<const int32_t> context) { return next_token_logits(context); }, on_byte);
}

std::optional<NonFiniteWeight> find_non_finite(const LlamaConfig& config,
                                               std::span<const std::vector<float>> weights) {
  const LlamaGenerator checked(config, weights, LlamaGenerator::Cache::kOff);  // the layout
  return find_non_finite(make_llama(config), weights);
}

}  // namespace zerodp
