// An epoch's visiting order in O(1) memory: a keyed bijection of 0..S-1 computed one index
// at a time, for data sets whose sample count makes the sampler's materialized order
// (data/sampler.h, 8 bytes per sample per epoch) too big, e.g. a token stream on disk.
//
// Construction: a Feistel network over the smallest power-of-two domain 2^b >= S (b bits
// split into a high half of floor(b/2) bits and a low half of the rest; the halves swap
// widths each round, kRounds rounds, an even number, so the widths come back), made a
// bijection of 0..S-1 by cycle-walking: permute(i) applies the network until the value falls
// below S (fewer than 2 applications on average, since 2^b < 2S). Each round XORs one half
// with the low bits of splitmix64's mix64(other half ^ round key); the round keys are a
// SplitMix64 sequence seeded by derive_key(seed, "FEISTEL1", epoch) (data/random.h), so the
// order is a pure function of (size, seed, epoch), the same on every platform, and a new
// epoch or seed gives another order.
//
// It is a different order from epoch_order()'s Fisher-Yates shuffle for the same (seed,
// epoch); runs that use one do not reproduce runs that used the other. A Feistel network is
// a shuffle good enough for data order (every position's sample looks independent of its
// neighbours'), not a uniformly random permutation: for tiny S (2, 3, 4) only some orders
// are reachable.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace zerodp {

class KeyedPermutation {
 public:
  static constexpr int kRounds = 6;
  static constexpr uint64_t kMaxSize = uint64_t{1} << 63;

  // Throws InvalidArgument when size is above kMaxSize (size 0 is an empty order).
  KeyedPermutation(uint64_t size, uint64_t seed, uint64_t epoch);

  uint64_t size() const { return size_; }
  // The sample at position `index` of the order; inverse() maps it back. Both are pure,
  // O(1) time and memory, and throw InvalidArgument for an argument >= size().
  uint64_t permute(uint64_t index) const;
  uint64_t inverse(uint64_t value) const;
  // Positions [first, first + out.size()) of the order into out (InvalidArgument past size()).
  void permute(uint64_t first, std::span<uint64_t> out) const;

 private:
  uint64_t encrypt(uint64_t x) const;  // one pass of the network over 0..2^b-1
  uint64_t decrypt(uint64_t x) const;

  uint64_t size_ = 0;
  int high_bits_ = 0;  // the halves' widths, high and low
  int low_bits_ = 0;
  std::array<uint64_t, kRounds> keys_{};
};

}  // namespace zerodp
