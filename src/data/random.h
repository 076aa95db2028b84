// Counter-based randomness for data order and synthetic data.
//
// Everything here is integer arithmetic with fixed constants, so the same (seed, epoch,
// index) gives the same numbers on every platform, compiler and standard library (the
// distributions in <random> are implementation-defined and are not used for that reason).
#pragma once

#include <cstdint>

namespace zerodp::data_random {

// The splitmix64 finalizer (Steele, Lea & Flood 2014): a bijection on 64-bit integers
// with good avalanche, used to hash counters.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Distinct purposes draw from distinct streams, so e.g. the epoch order is not
// correlated with synthetic content built from the same seed.
enum class Stream : uint64_t {
  kEpochShuffle = 0x53485546464c4531ULL,  // "SHUFFLE1"
  kSyntheticText = 0x53594e5454585431ULL,
  kSyntheticImage = 0x53594e54494d4731ULL,
};

// A key for (seed, stream, counter): mix64(mix64(mix64(seed) ^ stream) ^ counter).
constexpr uint64_t derive_key(uint64_t seed, Stream stream, uint64_t counter) {
  return mix64(mix64(mix64(seed) ^ static_cast<uint64_t>(stream)) ^ counter);
}

// The splitmix64 generator: state advances by the golden-ratio increment, output is
// mix64(state).
class SplitMix64 {
 public:
  explicit constexpr SplitMix64(uint64_t seed) : state_(seed) {}

  constexpr uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix64(state_);
  }

  // Uniform in [0, bound), bound >= 1, without modulo bias: draws below 2^64 mod bound are
  // rejected (the arc4random_uniform method), so the result is exact and portable.
  constexpr uint64_t below(uint64_t bound) {
    const uint64_t reject_below = (0 - bound) % bound;  // 2^64 mod bound
    uint64_t r = next();
    while (r < reject_below) r = next();
    return r % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace zerodp::data_random
