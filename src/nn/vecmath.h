// Elementwise math shared by the layer kernels (private to nn/), written so that a loop of it
// vectorizes and still gives the same bits in every lane, clone and instruction set: plain
// fp32 operations in a fixed order, no libm, no reassociation.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace zerodp::nn_detail {

// exp(y) for y <= 0, by range reduction plus a degree-7 polynomial (relative error ~1e-7),
// flushed to 0 below -87 (exp(-87) = 1.6e-38: what it multiplies or is added to is at
// least ~1 wherever it is used, in GELU's Phi and pdf and in softmax, whose largest term is 1).
// The clamp is a select: callers' loops vectorize only when compiled with -fno-trapping-math.
inline float exp_nonpositive(float y) {
  y = y < -87.0f ? -87.0f : y;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = hi + lo, hi exact in 9 bits
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (y * kLog2e + kRound) - kRound;
  const float r = (y - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln2 / 2
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
  return p * std::bit_cast<float>(bits);
}

// Sums in kLanes independent partial sums (element i goes to lane i % kLanes), combined in
// a fixed tree: the compiler may keep the lanes in vector registers without reassociating
// anything. A single running sum cannot vectorize under strict IEEE semantics.
constexpr size_t kLanes = 16;

inline float combine(float (&lane)[kLanes]) {
  for (size_t width = kLanes / 2; width > 0; width /= 2) {
    for (size_t l = 0; l < width; ++l) lane[l] += lane[l + width];
  }
  return lane[0];
}

}  // namespace zerodp::nn_detail
