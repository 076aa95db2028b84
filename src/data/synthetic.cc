#include "data/synthetic.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include <fmt/core.h>

#include "core/error.h"
#include "data/random.h"

namespace zerodp {

using data_random::derive_key;
using data_random::SplitMix64;
using data_random::Stream;

std::vector<uint8_t> synthetic_text(uint64_t seed, uint64_t size_bytes, int period) {
  constexpr int kPrintable = '~' - '!' + 1;  // 94
  if (period < 2 || period > kPrintable) {
    throw InvalidArgument(fmt::format(
        "synthetic text: period {} is invalid; use 2..{} (distinct printable characters)", period,
        kPrintable));
  }
  // The cycle: the first `period` characters of a seeded Fisher-Yates shuffle of '!'..'~'.
  std::vector<uint8_t> alphabet(kPrintable);
  std::iota(alphabet.begin(), alphabet.end(), static_cast<uint8_t>('!'));
  SplitMix64 rng(derive_key(seed, Stream::kSyntheticText, 0));
  for (size_t i = alphabet.size() - 1; i > 0; --i)
    std::swap(alphabet[i], alphabet[rng.below(i + 1)]);
  std::vector<uint8_t> text(size_bytes);
  for (uint64_t k = 0; k < size_bytes; ++k) text[k] = alphabet[k % static_cast<uint64_t>(period)];
  return text;
}

ImageDataset synthetic_images(uint64_t seed, Split split, uint64_t count, int64_t rows,
                              int64_t cols) {
  constexpr int kClasses = 10;
  constexpr int kNoise = 48;
  if (rows < 1 || cols < 1) {
    throw InvalidArgument(
        fmt::format("synthetic images: {}x{} is invalid; use positive sizes", rows, cols));
  }
  const size_t P = static_cast<size_t>(rows * cols);
  // Prototypes: counter 2^63 + class keeps them apart from the per-sample counters below.
  std::vector<uint8_t> prototypes(kClasses * P);
  for (size_t c = 0; c < kClasses; ++c) {
    SplitMix64 rng(derive_key(seed, Stream::kSyntheticImage, (uint64_t{1} << 63) + c));
    for (size_t p = 0; p < P; ++p) prototypes[c * P + p] = static_cast<uint8_t>(rng.below(256));
  }
  auto pixels = std::make_shared<std::vector<uint8_t>>(count * P);
  auto labels = std::make_shared<std::vector<uint8_t>>(count);
  // Counter = 2 * sample + split: train and validation samples are distinct draws.
  const uint64_t split_bit = split == Split::kTrain ? 0 : 1;
  for (uint64_t i = 0; i < count; ++i) {
    SplitMix64 rng(derive_key(seed, Stream::kSyntheticImage, 2 * i + split_bit));
    const auto label = static_cast<uint8_t>(rng.below(kClasses));
    (*labels)[i] = label;
    const uint8_t* prototype = prototypes.data() + label * P;
    uint8_t* image = pixels->data() + i * P;
    for (size_t p = 0; p < P; ++p) {
      const int noise = static_cast<int>(rng.below(2 * kNoise + 1)) - kNoise;
      image[p] = static_cast<uint8_t>(std::clamp(int{prototype[p]} + noise, 0, 255));
    }
  }
  return ImageDataset(std::move(pixels), std::move(labels), rows, cols, kClasses,
                      std::string("synthetic/") + split_name(split));
}

}  // namespace zerodp
