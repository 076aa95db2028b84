// What safetensors.cc (the header and the reader) and safetensors_writer.cc share: the texts
// their messages quote and the checked size of a tensor.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace zerodp::safetensors::detail {

// Names come from untrusted files: JSON-escaping keeps a message one printable line.
inline std::string json_quoted(std::string_view s) {
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline std::string shape_text(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Bytes of a tensor, nullopt past 2^64. A zero dimension makes it 0 whatever the others are.
inline std::optional<uint64_t> checked_bytes(std::span<const int64_t> shape, size_t element_bytes) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  uint64_t n = element_bytes;
  for (const int64_t d : shape) {
    const auto u = static_cast<uint64_t>(d);
    if (n > std::numeric_limits<uint64_t>::max() / u) return std::nullopt;
    n *= u;
  }
  return n;
}

inline std::array<std::byte, 8> store_le64(uint64_t v) {
  std::array<std::byte, 8> out;
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<std::byte>(v >> (8 * i));
  return out;
}

}  // namespace zerodp::safetensors::detail
