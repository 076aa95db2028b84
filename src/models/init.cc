#include "models/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace zerodp {

namespace {

// The splitmix64 finalizer (Steele, Lea & Flood 2014).
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;       // splitmix64's increment
constexpr uint64_t kInitStream = 0x494e495457454931ULL;  // "INITWEI1"

// FNV-1a, 64-bit: a stable hash of the tensor name's bytes.
constexpr uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t tensor_key(uint64_t seed, const TensorSpec& t) {
  return mix64(mix64(mix64(seed) ^ kInitStream) ^ fnv1a(t.name));
}

// N(0, 1) for element `index`: splitmix64 outputs number 2i+1 and 2i+2 of the keyed stream.
double standard_normal(uint64_t key, size_t index) {
  const uint64_t n = 2 * static_cast<uint64_t>(index);
  const uint64_t r1 = mix64(key + (n + 1) * kGamma);
  const uint64_t r2 = mix64(key + (n + 2) * kGamma);
  constexpr double kTwoPow53 = 9007199254740992.0;
  const double u1 = (static_cast<double>(r1 >> 11) + 1.0) / kTwoPow53;  // (0, 1]: log finite
  const double u2 = static_cast<double>(r2 >> 11) / kTwoPow53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

float value_with_key(uint64_t key, const TensorSpec& t, size_t index) {
  switch (t.init) {
    case InitKind::kZeros:
      return 0.0f;
    case InitKind::kOnes:
      return 1.0f;
    case InitKind::kNormal:
      return static_cast<float>(static_cast<double>(t.init_std) * standard_normal(key, index));
  }
  return 0.0f;  // unreachable: every InitKind is handled above
}

}  // namespace

float initial_value(uint64_t seed, const TensorSpec& t, size_t index) {
  return value_with_key(tensor_key(seed, t), t, index);
}

void initialize_range(uint64_t seed, const Unit& u, size_t begin, size_t end,
                      std::span<float> out) {
  if (begin > end || end > u.numel() || out.size() != end - begin) {
    throw InvalidArgument(fmt::format(
        "initialize_range: unit {} has {} elements; range [{}, {}) with an output of {} "
        "elements does not fit (need begin <= end <= {} and an output of end - begin)",
        u.name(), u.numel(), begin, end, out.size(), u.numel()));
  }
  // Every element is a pure function of its position, so a large range split across the
  // cores gives the same bits; a 2-billion-parameter model's start is minutes otherwise.
  constexpr size_t kPerThread = size_t{1} << 17;
  const size_t threads = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()),
                                          (end - begin) / kPerThread);
  if (threads > 1) {
    const size_t share = (end - begin + threads - 1) / threads;
    std::vector<std::thread> helpers;
    for (size_t t = 1; t < threads; ++t) {
      const size_t b = begin + t * share, e = std::min(end, b + share);
      helpers.emplace_back(
          [=, &u] { initialize_range(seed, u, b, e, out.subspan(b - begin, e - b)); });
    }
    initialize_range(seed, u, begin, begin + share, out.first(share));
    for (std::thread& h : helpers) h.join();
    return;
  }
  const auto& tensors = u.tensors();
  // The first tensor whose end is past `begin` (tensors are contiguous and in offset order).
  auto it =
      std::upper_bound(tensors.begin(), tensors.end(), begin,
                       [](size_t pos, const TensorSpec& t) { return pos < t.offset + t.numel; });
  size_t pos = begin;
  for (; pos < end && it != tensors.end(); ++it) {
    const TensorSpec& t = *it;
    const size_t stop = std::min(end, t.offset + t.numel);
    const uint64_t key = tensor_key(seed, t);
    for (; pos < stop; ++pos) out[pos - begin] = value_with_key(key, t, pos - t.offset);
  }
}

std::vector<float> initial_weights(uint64_t seed, const Unit& u) {
  std::vector<float> w(u.numel());
  initialize_range(seed, u, 0, u.numel(), w);
  return w;
}

}  // namespace zerodp
