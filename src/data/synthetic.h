// Synthetic data for tests and quick runs: deterministic from a seed, learnable, and
// served through the same TokenDataset / ImageDataset types as the real data.
#pragma once

#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "data/idx.h"

namespace zerodp {

// A text of `size_bytes` bytes that repeats one cycle of `period` distinct printable
// characters (from '!'..'~'), the cycle's order drawn from the seed. The next byte is a
// function of the current one, so a bigram model can drive the loss from ln 256 ≈ 5.55
// towards 0, and a transformer does so within tens of steps. Throws InvalidArgument unless
// 2 <= period <= 94.
std::vector<uint8_t> synthetic_text(uint64_t seed, uint64_t size_bytes, int period = 64);

// `count` rows x cols images in 10 classes. Class c has a prototype image drawn from
// (seed, c); sample i of a split draws, from (seed, split, i), a uniform label and per-pixel
// noise in [-48, 48] added to its class's prototype, clamped to 0..255. The train and validation
// splits share the prototypes and differ in their samples, so what a model learns on one carries
// over to the other.
ImageDataset synthetic_images(uint64_t seed, Split split, uint64_t count, int64_t rows = 28,
                              int64_t cols = 28);

}  // namespace zerodp
