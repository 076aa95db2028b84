// A batch of samples as the engine consumes it, for each task kind.
#pragma once

#include <cstdint>
#include <vector>

namespace zerodp {

struct TokenBatch {
  int64_t batch = 0;             // B
  int64_t seq_len = 0;           // T
  std::vector<int32_t> inputs;   // (B, T) tokens (bytes for byte-level data)
  std::vector<int32_t> targets;  // (B, T) inputs shifted by one: the next token
};

struct ImageBatch {
  int64_t batch = 0;             // B
  int64_t pixels_per_image = 0;  // P = rows * cols
  std::vector<float> pixels;     // (B, P) in [0, 1]: the stored byte / 255
  std::vector<int32_t> labels;   // (B) in 0..classes-1
};

}  // namespace zerodp
