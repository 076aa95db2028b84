// Elementwise math shared by the layer kernels (private to nn/), written so that a loop of it
// vectorizes and still gives the same bits in every lane, clone and instruction set: fp32
// operations and exactly rounded fused multiply-adds in a fixed order, no reassociation.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace zerodp::nn_detail {

// The clones every vectorized loop of nn/ is compiled as, one chosen at load time. Each does
// the same IEEE operations in the same order; fused multiply-adds appear only where written
// as std::fma, which is exactly rounded wherever it runs (an instruction in the v3 and v4
// clones, glibc's fmaf in the default one, slow but the same bits), and the build forbids
// contracting anything else (-ffp-contract=off). So the bits do not depend on the clone.
// Not under ThreadSanitizer, whose runtime is not set up yet when the loader runs the
// clones' ifunc resolvers (instrumented, they crash the program before main).
#if !defined(__SANITIZE_THREAD__)
#define ZERODP_NN_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ZERODP_NN_CLONES
#endif

// exp(y) for y <= 0, by range reduction plus a degree-7 polynomial in fused multiply-adds
// (relative error ~1e-7), flushed to 0 below -87 (exp(-87) = 1.6e-38: what it multiplies or
// is added to is at least ~1 wherever it is used, in GELU's Phi and pdf and in softmax, whose
// largest term is 1). Callers are ZERODP_NN_CLONES loops: elsewhere each fma is a libm call.
// The clamp is a select: callers' loops vectorize only when compiled with -fno-trapping-math.
inline float exp_nonpositive(float y) {
  y = y < -87.0f ? -87.0f : y;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = hi + lo, hi exact in 9 bits
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = std::fma(y, kLog2e, kRound) - kRound;
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, y));  // |r| <= ln2 / 2
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 0]
  return p * std::bit_cast<float>(bits);
}

// Sums in kLanes independent partial sums (element i goes to lane i % kLanes), combined in
// a fixed tree. A single running sum cannot vectorize under strict IEEE semantics. The lanes
// are one GCC vector value, whose operations are elementwise IEEE ones: each target_clones
// clone lowers it to its own registers (one zmm, two ymm, four xmm) with the same bits. (A
// float[16] written with an inner lane loop also vectorizes, but GCC turned LayerNorm's
// backward into a shuffle-heavy outer-loop vectorization at a third of this speed.)
constexpr size_t kLanes = 16;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

inline Lanes load_lanes(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store_lanes(float* p, const Lanes& v) { std::memcpy(p, &v, sizeof v); }

inline float combine(const Lanes& v) {
  float lane[kLanes];
  std::memcpy(lane, &v, sizeof lane);
  for (size_t width = kLanes / 2; width > 0; width /= 2) {
    for (size_t l = 0; l < width; ++l) lane[l] += lane[l + width];
  }
  return lane[0];
}

// The largest of x[0..n), n >= 1.
inline float max_of(const float* x, size_t n) {
  Lanes lane = Lanes{} + x[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Lanes v = load_lanes(x + i);
    lane = lane < v ? v : lane;
  }
  float lanes[kLanes];
  std::memcpy(lanes, &lane, sizeof lanes);
  float m = lanes[0];
  for (size_t l = 1; l < kLanes; ++l) m = m < lanes[l] ? lanes[l] : m;
  for (; i < n; ++i) m = m < x[i] ? x[i] : m;
  return m;
}

// The sum of e[u] = exp(x[u] - m) over u < n (m >= every x[u]); e may be x, or null to only sum.
inline float sum_exp_shifted(float* e, const float* x, float m, size_t n) {
  Lanes lane = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Lanes v = load_lanes(x + i) - m;
    for (size_t l = 0; l < kLanes; ++l) v[l] = exp_nonpositive(v[l]);
    if (e != nullptr) store_lanes(e + i, v);
    lane += v;
  }
  float sum = combine(lane);
  for (; i < n; ++i) {
    const float v = exp_nonpositive(x[i] - m);
    if (e != nullptr) e[i] = v;
    sum += v;
  }
  return sum;
}

}  // namespace zerodp::nn_detail
