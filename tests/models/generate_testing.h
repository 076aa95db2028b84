// Helpers shared by the generation tests: a prompt's bytes as tokens, greedy options.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "models/generate.h"

namespace zerodp::generate_testing {

inline std::vector<int32_t> bytes_of(std::string_view s) {
  std::vector<int32_t> t;
  for (char c : s) t.push_back(static_cast<unsigned char>(c));
  return t;
}

inline GenerateOptions greedy(int max_tokens) {
  return GenerateOptions{.max_tokens = max_tokens, .temperature = 0.0, .top_k = 0, .seed = 1};
}

}  // namespace zerodp::generate_testing
