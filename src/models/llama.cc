// llama.h is the contract.
#include "models/llama.h"

#include <array>
#include <cmath>
#include <string>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

void validate(const LlamaConfig& c) {
  const auto positive = [](const char* name, int v) {
    if (v < 1)
      throw InvalidArgument(fmt::format("llama: {} is {}; it must be at least 1", name, v));
  };
  positive("layers", c.layers);
  positive("heads", c.heads);
  positive("kv_heads", c.kv_heads);
  positive("embd", c.embd);
  positive("ffn", c.ffn);
  positive("seq_len", c.seq_len);
  if (c.vocab < 2) {
    throw InvalidArgument(
        fmt::format("llama: vocab is {}; a vocabulary has 2 tokens or more", c.vocab));
  }
  if (c.embd % c.heads != 0) {
    throw InvalidArgument(fmt::format(
        "llama: heads {} does not divide embd {}; use a divisor of {}", c.heads, c.embd, c.embd));
  }
  if (c.head_size() % 2 != 0) {
    throw InvalidArgument(fmt::format(
        "llama: the head size embd / heads = {} / {} = {} is odd; rotary positions turn a head's "
        "two halves against each other, so use heads that leave an even head size",
        c.embd, c.heads, c.head_size()));
  }
  if (c.heads % c.kv_heads != 0) {
    throw InvalidArgument(fmt::format(
        "llama: kv_heads {} does not divide heads {}; grouped-query attention shares each "
        "key/value head among heads / kv_heads query heads, so use a divisor of {}",
        c.kv_heads, c.heads, c.heads));
  }
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta)) {
    throw InvalidArgument(
        fmt::format("llama: rope_theta is {}; use a base above 1, e.g. 10000", c.rope_theta));
  }
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps)) {
    throw InvalidArgument(
        fmt::format("llama: norm_eps is {}; use a small positive number, e.g. 1e-5", c.norm_eps));
  }
}

int llama_ffn_multiple(int embd) { return embd <= 384 ? 64 : 256; }

int llama_ffn_hidden(int embd, int multiple) {
  if (embd < 1 || multiple < 1) {
    throw InvalidArgument(fmt::format(
        "llama_ffn_hidden: embd {} and multiple {} must both be at least 1", embd, multiple));
  }
  const int64_t truncated = int64_t{8} * embd / 3;
  return static_cast<int>((truncated + multiple - 1) / multiple * multiple);
}

uint64_t llama_parameter_count(const LlamaConfig& c) {
  validate(c);
  const auto C = static_cast<uint64_t>(c.embd);
  const auto kv = static_cast<uint64_t>(c.kv_heads) * static_cast<uint64_t>(c.head_size());
  const auto F = static_cast<uint64_t>(c.ffn);
  const uint64_t block = 2 * C + 2 * C * C + 2 * C * kv + 3 * C * F;
  return 2 * static_cast<uint64_t>(c.vocab) * C + static_cast<uint64_t>(c.layers) * block + C;
}

namespace {

constexpr std::array<LlamaPreset, 5> kPresets{{
    {"tiny", {.layers = 2, .heads = 2, .kv_heads = 1, .embd = 32, .ffn = 128, .seq_len = 32}, 8},
    {"small", {.layers = 4, .heads = 4, .kv_heads = 2, .embd = 128, .ffn = 384, .seq_len = 64}, 16},
    {"medium",
     {.layers = 6, .heads = 6, .kv_heads = 2, .embd = 384, .ffn = 1024, .seq_len = 128},
     8},
    {"large",
     {.layers = 12, .heads = 12, .kv_heads = 4, .embd = 768, .ffn = 2048, .seq_len = 1024},
     4},
    {"1.1b",
     {.layers = 22,
      .heads = 32,
      .kv_heads = 4,
      .embd = 2048,
      .ffn = 5632,
      .seq_len = 2048,
      .vocab = 32000},
     1},
}};

}  // namespace

std::span<const LlamaPreset> llama_presets() { return kPresets; }

const LlamaPreset& llama_preset(std::string_view name) {
  std::string known;
  for (const LlamaPreset& p : kPresets) {
    if (p.name == name) return p;
    known += fmt::format("{}{}", known.empty() ? "" : ", ", p.name);
  }
  throw InvalidArgument(fmt::format("--size '{}' is unknown for the llama; use {}", name, known));
}

}  // namespace zerodp
