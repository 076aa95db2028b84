// The readers and rules the table of options (options.cc) builds its entries from: each
// takes an option's text or value and refuses what is out of range through
// OptionSpec::refuse, naming the flag and what would work.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/units.h"
#include "train/config.h"
#include "train/options.h"

namespace zerodp::option_readers {

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
inline int quant_block(const std::string& text, const OptionSpec& o) {
  const auto v = whole<int64_t>(text, o);
  if (v < static_cast<int64_t>(kQuantBlockRange.min) ||
      v > static_cast<int64_t>(kQuantBlockRange.max)) {
    o.refuse(text);
  }
  return static_cast<int>(v);
}
inline int shape(const std::string& text, const OptionSpec& o) {
  const int v = whole<int>(text, o);
  if (v < 1) o.refuse(text);
  return v;
}

}  // namespace zerodp::option_readers
