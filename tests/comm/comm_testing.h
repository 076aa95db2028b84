// What the local backend's collective tests share (comm_test.cc and its neighbours, one
// binary; quantize_test.cc takes the dtype conversions): inputs that depend on rank and
// index, and the plain reference reduction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "comm/communicator.h"
#include "tensor/dtype.h"

namespace zerodp::comm_test {

inline const CommOptions kOptions{.timeout_seconds = 30};

// A value that depends on rank and index and has enough mantissa bits that 16-bit rounding
// and summation order both matter.
inline float input_value(int rank, size_t i) {
  const uint32_t h = static_cast<uint32_t>(i * 2654435761u + static_cast<uint32_t>(rank) * 40503u);
  return static_cast<float>(h % 20011u) / 97.0f - 100.0f + static_cast<float>(rank) * 0.013f;
}

template <typename T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return to_bf16(x);
  } else {
    return to_f16(x);
  }
}

template <typename T>
float widen(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_f32(x);
  }
}

template <typename T>
std::vector<T> make_input(int rank, size_t count) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = from_float<T>(input_value(rank, i));
  return v;
}

// The contract, written out plainly: fp32, rank order, divide, round once.
template <typename T>
T reference_reduce(int world, size_t i, ReduceOp op) {
  float acc = widen(from_float<T>(input_value(0, i)));
  for (int r = 1; r < world; ++r) {
    const float x = widen(from_float<T>(input_value(r, i)));
    acc = op == ReduceOp::kMax ? std::max(acc, x) : acc + x;
  }
  if (op == ReduceOp::kAvg) acc /= static_cast<float>(world);
  return from_float<T>(acc);
}

template <typename T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace zerodp::comm_test
