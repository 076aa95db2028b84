// Shape checks shared by the layer kernels (private to nn/).
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"

namespace zerodp::nn_detail {

// Throws InvalidArgument unless `buffer` holds exactly `expected` elements:
// "layernorm_forward: inp holds 100 elements; (rows=10, C=12) needs 120".
inline void check_size(std::string_view fn, std::string_view name, size_t size, size_t expected,
                       std::string_view shape) {
  if (size != expected) {
    throw InvalidArgument(
        fmt::format("{}: {} holds {} elements; {} needs {}", fn, name, size, shape, expected));
  }
}

template <typename T>
void check_count(std::string_view fn, std::string_view name, std::span<T> buffer, size_t expected,
                 std::string_view shape) {
  check_size(fn, name, buffer.size(), expected, shape);
}

// As check_count, but an empty buffer is also accepted (an optional operand).
template <typename T>
void check_optional_count(std::string_view fn, std::string_view name, std::span<T> buffer,
                          size_t expected, std::string_view shape) {
  if (!buffer.empty()) check_count(fn, name, buffer, expected, shape);
}

}  // namespace zerodp::nn_detail
