// What the parts of the table of options (options_*.cc) build their entries from: the
// readers and rules, each taking an option's text or value and refusing what is out of range
// through OptionSpec::refuse, naming the flag and what would work; the answer of an idle
// rule; and the parts themselves, which option_table() joins in this order.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/units.h"
#include "train/config.h"
#include "train/options.h"

namespace zerodp {

// The table's sections, in --help's order: the model and its data (options_model.cc), the
// parallelism (options_parallelism.cc), the optimization, checkpoints, reliability and output
// (options_training.cc); then the llama's shape (options_llama.cc) and DiLoCo's
// (options_islands.cc), which --help lists after the rest of their sections.
std::span<const OptionSpec> model_option_table();
std::span<const OptionSpec> parallelism_option_table();
std::span<const OptionSpec> training_option_table();
std::span<const OptionSpec> llama_option_table();
std::span<const OptionSpec> island_option_table();

}  // namespace zerodp

namespace zerodp::option_readers {

inline constexpr unsigned kBoth = kTrainCommand | kEstimateCommand;

// An idle rule's answer (OptionSpec::idle): nothing while the option `acts`, else `needs`.
inline std::string_view unless(bool acts, std::string_view needs) {
  return acts ? std::string_view() : needs;
}

// The idle rules of the shape options: a kind the command line builds leaves another kind's
// shape idle; a caller's kinds (custom-text, custom-images) keep the fields they record.
inline std::string_view transformer_shape(const TrainConfig& c) {
  return unless(c.model != "mlp", "it shapes a gpt or a llama; use --model gpt or llama");
}
inline std::string_view llama_shape(const TrainConfig& c) {
  return unless(c.model != "gpt" && c.model != "mlp", "it shapes a llama; use --model llama");
}
inline std::string_view mlp_shape(const TrainConfig& c) {
  return unless(c.model != "gpt" && c.model != "llama", "it shapes an mlp; use --model mlp");
}

// The whole text as an integer of T's range: -1 is never 2^64 - 1, 2^32 + 1 never 1.
template <typename T>
inline T whole(const std::string& text, const OptionSpec& o) {
  T v{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) o.refuse(text);
  return v;
}

// A finite number in [min, max] (min excluded when `open`); fp32's range by default, the
// engine holding these as float.
inline double finite(const std::string& text, const OptionSpec& o, double min, bool open,
                     double max = std::numeric_limits<float>::max()) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  const bool ok = ec == std::errc() && ptr == end && std::isfinite(v) &&
                  (open ? v > min : v >= min) && v <= max;
  if (!ok) o.refuse(text);
  return v;
}

inline bool on_off(const std::string& text, const OptionSpec& o) {
  if (text == "on" || text == "true" || text == "1" || text == "yes") return true;
  if (text == "off" || text == "false" || text == "0" || text == "no") return false;
  o.refuse(fmt::format("'{}'", text));
}

template <typename T>
inline void at_least(T value, T min, const OptionSpec& o) {
  if (value < min) o.refuse(fmt::format("{}", value));
}

// A simulated link's rate or latency: unset (0) records as null, since the flags take no zero.
inline nlohmann::json unless_zero(double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(); }
inline double link_bandwidth(const std::string& text, const OptionSpec& o) {
  return parse_bandwidth(text, o.flag(), kLinkBandwidthRange.min, kLinkBandwidthRange.max);
}
inline double link_latency(const std::string& text, const OptionSpec& o) {
  return parse_seconds(text, o.flag(), kLinkLatencyRange.min, kLinkLatencyRange.max);
}
// Elements per quantization scale: kQuantBlockRange, read as text or set in code.
inline bool quant_block_fits(int64_t v) {
  return v >= static_cast<int64_t>(kQuantBlockRange.min) &&
         v <= static_cast<int64_t>(kQuantBlockRange.max);
}
inline int quant_block(const std::string& text, const OptionSpec& o) {
  const auto v = whole<int64_t>(text, o);
  if (!quant_block_fits(v)) o.refuse(text);
  return static_cast<int>(v);
}
inline void check_quant_block(int64_t v, const OptionSpec& o) {
  if (!quant_block_fits(v)) o.refuse(std::to_string(v));
}
inline int shape(const std::string& text, const OptionSpec& o) {
  const int v = whole<int>(text, o);
  if (v < 1) o.refuse(text);
  return v;
}

}  // namespace zerodp::option_readers
