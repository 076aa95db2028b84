// A batch of samples as the engine consumes it, for each task kind.
#pragma once

#include <cstdint>
#include <span>
#include <string>
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

// What every token dataset's fill() checks first: `inputs` and `targets` hold
// indices.size() x seq_len values each, and every index is below `size`. InvalidArgument
// naming the dataset (`name`) and what is wrong otherwise.
void check_token_batch(const std::string& name, uint64_t size, int64_t seq_len,
                       std::span<const uint64_t> indices, size_t inputs, size_t targets);

}  // namespace zerodp
