#include "core/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {
namespace {

struct Split {
  double number;
  std::string suffix;
};

bool split_number(std::string_view text, Split& out) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const std::string s(text.substr(i));
  if (s.empty()) return false;
  size_t used = 0;
  try {
    out.number = std::stod(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  std::string rest = s.substr(used);
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) rest.erase(0, 1);
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.pop_back();
  out.suffix = rest;
  return std::isfinite(out.number);
}

double byte_multiplier(const std::string& suffix) {
  struct Unit {
    const char* name;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"B", 1},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
      {"KiB", 1024.0},
      {"MiB", 1048576.0},
      {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0},
      {"K", 1024.0},
      {"M", 1048576.0},
      {"G", 1073741824.0},
  };
  for (const auto& u : kUnits) {
    if (suffix == u.name) return u.scale;
  }
  return -1;
}

}  // namespace

uint64_t parse_bytes(std::string_view text, std::string_view what) {
  Split s{};
  double scale = -1;
  if (split_number(text, s)) scale = byte_multiplier(s.suffix);
  if (scale < 0 || s.number < 0 || s.number * scale >= 1.8e19) {
    throw InvalidArgument(fmt::format(
        "{}: '{}' is not a size; write a number with an optional unit, e.g. 2GiB, 512MB, 4096",
        what, text));
  }
  return static_cast<uint64_t>(std::llround(s.number * scale));
}

double parse_bandwidth(std::string_view text, std::string_view what) {
  std::string_view t = text;
  if (t.size() >= 2 && t.substr(t.size() - 2) == "/s") t.remove_suffix(2);
  Split s{};
  double scale = -1;
  if (split_number(t, s)) scale = byte_multiplier(s.suffix);
  if (scale < 0 || s.number <= 0) {
    throw InvalidArgument(fmt::format(
        "{}: '{}' is not a bandwidth; write a positive number of bytes per second, e.g. 1GB/s, "
        "100MB/s, 25GiB/s",
        what, text));
  }
  return s.number * scale;
}

double parse_seconds(std::string_view text, std::string_view what) {
  Split s{};
  double scale = -1;
  if (split_number(text, s)) {
    if (s.suffix.empty() || s.suffix == "s")
      scale = 1;
    else if (s.suffix == "ms")
      scale = 1e-3;
    else if (s.suffix == "us")
      scale = 1e-6;
    else if (s.suffix == "ns")
      scale = 1e-9;
    else if (s.suffix == "min")
      scale = 60;
    else if (s.suffix == "h")
      scale = 3600;
    else if (s.suffix == "day" || s.suffix == "days")
      scale = 86400;
  }
  if (scale < 0 || s.number < 0) {
    throw InvalidArgument(fmt::format(
        "{}: '{}' is not a duration; write a number of seconds or use a unit (ns, us, ms, s, min, "
        "h, day), e.g. 20us, 5ms, 300, 2h",
        what, text));
  }
  return s.number * scale;
}

namespace {

// `v`, parsed from `text`, or InvalidArgument naming the range in `format`'s words.
double in_range(double v, std::string_view text, std::string_view what, double lo, double hi,
                std::string (*format)(double)) {
  if (v < lo || v > hi) {
    throw InvalidArgument(
        fmt::format("{} {} is out of range; use {} to {}", what, text, format(lo), format(hi)));
  }
  return v;
}

}  // namespace

double parse_bandwidth(std::string_view text, std::string_view what, double lo, double hi) {
  return in_range(parse_bandwidth(text, what), text, what, lo, hi, format_bandwidth);
}

double parse_seconds(std::string_view text, std::string_view what, double lo, double hi) {
  return in_range(parse_seconds(text, what), text, what, lo, hi, format_seconds);
}

uint64_t parse_seed(std::string_view text, std::string_view what) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw InvalidArgument(fmt::format(
        "{} {} is invalid; use a whole number from 0 to 18446744073709551615", what, text));
  }
  return v;
}

std::string format_seconds(double seconds) {
  if (seconds == 0) return "0 s";
  if (seconds >= 86400)
    return fmt::format("{:g} {}", seconds / 86400, seconds == 86400 ? "day" : "days");
  if (seconds >= 3600) return fmt::format("{:g} h", seconds / 3600);
  if (seconds >= 60) return fmt::format("{:g} min", seconds / 60);
  if (seconds >= 1) return fmt::format("{:g} s", seconds);
  if (seconds >= 1e-3) return fmt::format("{:g} ms", seconds * 1e3);
  if (seconds >= 1e-6) return fmt::format("{:g} us", seconds * 1e6);
  return fmt::format("{:g} ns", seconds * 1e9);
}

std::string format_bandwidth(double bytes_per_second) {
  static constexpr const char* kNames[] = {"B/s", "KB/s", "MB/s", "GB/s", "TB/s", "PB/s"};
  int i = 0;
  double v = bytes_per_second;
  while (v >= 1000.0 && i < 5) {
    v /= 1000.0;
    ++i;
  }
  return fmt::format("{:g} {}", v, kNames[i]);
}

std::string format_bytes(double bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && i < 5) {
    v /= 1024.0;
    ++i;
  }
  if (i == 0) return fmt::format("{:.0f} B", v);
  return fmt::format("{:.2f} {}", v, kNames[i]);
}

}  // namespace zerodp
