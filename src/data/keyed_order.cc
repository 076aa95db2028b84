#include "data/keyed_order.h"

#include <bit>
#include <utility>

#include <fmt/core.h>

#include "core/error.h"
#include "data/random.h"

namespace zerodp {

namespace {

// The stream of the keyed order's round keys: "FEISTEL1". Not among data_random::Stream's
// names (data/random.h) so that file, which fixes the other orders' bits, stays as it is;
// the value is distinct from theirs.
constexpr auto kFeistelStream = static_cast<data_random::Stream>(0x4645495354454c31ULL);

constexpr uint64_t mask_of(int bits) { return bits == 0 ? 0 : ~uint64_t{0} >> (64 - bits); }

}  // namespace

KeyedPermutation::KeyedPermutation(uint64_t size, uint64_t seed, uint64_t epoch) : size_(size) {
  if (size > kMaxSize) {
    throw InvalidArgument(
        fmt::format("keyed order: {} samples is past the {} it can order", size, kMaxSize));
  }
  const int bits = size <= 1 ? 0 : static_cast<int>(std::bit_width(size - 1));
  high_bits_ = bits / 2;
  low_bits_ = bits - high_bits_;
  data_random::SplitMix64 keys(data_random::derive_key(seed, kFeistelStream, epoch));
  for (uint64_t& key : keys_) key = keys.next();
}

uint64_t KeyedPermutation::encrypt(uint64_t x) const {
  int left_bits = high_bits_;
  int right_bits = low_bits_;
  uint64_t left = x >> right_bits;
  uint64_t right = x & mask_of(right_bits);
  for (int i = 0; i < kRounds; ++i) {
    // (L, R) -> (R, L ^ F(R)): the halves trade places and widths.
    const uint64_t mixed = left ^ (data_random::mix64(right ^ keys_[i]) & mask_of(left_bits));
    left = right;
    right = mixed;
    std::swap(left_bits, right_bits);
  }
  return (left << right_bits) | right;  // an even number of rounds: widths as they began
}

uint64_t KeyedPermutation::decrypt(uint64_t x) const {
  int left_bits = high_bits_;
  int right_bits = low_bits_;
  uint64_t left = x >> right_bits;
  uint64_t right = x & mask_of(right_bits);
  for (int i = kRounds - 1; i >= 0; --i) {
    // Undoes round i: (R, L ^ F(R)) -> (L, R).
    const uint64_t previous_left =
        right ^ (data_random::mix64(left ^ keys_[i]) & mask_of(right_bits));
    right = left;
    left = previous_left;
    std::swap(left_bits, right_bits);
  }
  return (left << right_bits) | right;
}

uint64_t KeyedPermutation::permute(uint64_t index) const {
  if (index >= size_) {
    throw InvalidArgument(
        fmt::format("keyed order: position {} is past the order of {} samples", index, size_));
  }
  uint64_t y = encrypt(index);
  while (y >= size_) y = encrypt(y);  // cycle-walking: ends, since index's cycle holds index
  return y;
}

uint64_t KeyedPermutation::inverse(uint64_t value) const {
  if (value >= size_) {
    throw InvalidArgument(
        fmt::format("keyed order: sample {} is past the order of {} samples", value, size_));
  }
  uint64_t x = decrypt(value);
  while (x >= size_) x = decrypt(x);
  return x;
}

void KeyedPermutation::permute(uint64_t first, std::span<uint64_t> out) const {
  if (first > size_ || out.size() > size_ - first) {
    throw InvalidArgument(
        fmt::format("keyed order: positions [{}, {}) pass the order of {} samples", first,
                    first + out.size(), size_));
  }
  for (size_t i = 0; i < out.size(); ++i) out[i] = permute(first + i);
}

}  // namespace zerodp
