#include "data/keyed_order.h"

#include <cstdint>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "data/random.h"

namespace zerodp {
namespace {

// Every position maps to a distinct sample below size, and inverse() undoes it.
void expect_bijection(uint64_t size, uint64_t seed, uint64_t epoch) {
  const KeyedPermutation p(size, seed, epoch);
  std::vector<bool> hit(size, false);
  for (uint64_t i = 0; i < size; ++i) {
    const uint64_t v = p.permute(i);
    ASSERT_LT(v, size) << "size " << size << " index " << i;
    ASSERT_FALSE(hit[v]) << "size " << size << ": sample " << v << " hit twice";
    hit[v] = true;
    ASSERT_EQ(p.inverse(v), i) << "size " << size;
  }
}

TEST(KeyedPermutation, IsAPermutationForEverySize) {
  for (uint64_t size = 1; size <= 300; ++size) expect_bijection(size, 42, 3);
  for (const uint64_t size : {511u, 512u, 513u, 1000u, 4095u, 4097u, 65537u, 100003u}) {
    expect_bijection(size, 7, 0);
  }
  expect_bijection(uint64_t{1} << 20, 1, 1);
}

TEST(KeyedPermutation, LargeSizesSampled) {
  for (const uint64_t size : {uint64_t{1'000'000'000'007}, uint64_t{1} << 40,
                              (uint64_t{1} << 40) + 1, KeyedPermutation::kMaxSize}) {
    const KeyedPermutation p(size, 5, 9);
    data_random::SplitMix64 rng(size);
    for (int k = 0; k < 20000; ++k) {
      const uint64_t i = k < 10 ? static_cast<uint64_t>(k) : rng.below(size);
      const uint64_t v = p.permute(i);
      ASSERT_LT(v, size);
      ASSERT_EQ(p.inverse(v), i) << size << " " << i;  // so no two positions share v
    }
    // The last positions too.
    for (uint64_t i = size - 5; i < size; ++i) ASSERT_EQ(p.inverse(p.permute(i)), i);
  }
}

TEST(KeyedPermutation, IsAPureFunctionOfSizeSeedAndEpoch) {
  const KeyedPermutation a(1000, 11, 2);
  const KeyedPermutation b(1000, 11, 2);
  std::vector<uint64_t> range(1000);
  a.permute(0, range);
  for (uint64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(a.permute(i), b.permute(i));
    EXPECT_EQ(range[i], a.permute(i));
  }
  // Pinned, so a change to the order (which would change every run's data order) is seen.
  const KeyedPermutation pinned(1000, 0, 0);
  std::vector<uint64_t> first(8);
  pinned.permute(0, first);
  EXPECT_EQ(first, (std::vector<uint64_t>{716, 963, 346, 757, 205, 973, 337, 202}));
}

TEST(KeyedPermutation, EpochsAndSeedsGiveOtherOrders) {
  const uint64_t size = 1000;
  const KeyedPermutation base(size, 1, 0);
  const std::vector<std::pair<uint64_t, uint64_t>> others = {{1, 1}, {1, 2}, {2, 0}, {0, 0}};
  for (const auto& [seed, epoch] : others) {
    const KeyedPermutation other(size, seed, epoch);
    int same = 0;
    for (uint64_t i = 0; i < size; ++i) same += base.permute(i) == other.permute(i);
    EXPECT_LT(same, 20) << "seed " << seed << " epoch " << epoch;  // ~1 expected
  }
  // Not the identity, and not a rotation or stride either.
  int fixed = 0;
  int next_is_next = 0;
  for (uint64_t i = 0; i < size; ++i) {
    fixed += base.permute(i) == i;
    if (i + 1 < size) next_is_next += base.permute(i + 1) == base.permute(i) + 1;
  }
  EXPECT_LT(fixed, 20);
  EXPECT_LT(next_is_next, 20);
}

TEST(KeyedPermutation, OutOfRangeArgumentsAreRefused) {
  const KeyedPermutation empty(0, 1, 1);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_THROW(empty.permute(0), InvalidArgument);
  const KeyedPermutation one(1, 1, 1);
  EXPECT_EQ(one.permute(0), 0u);
  EXPECT_THROW(one.permute(1), InvalidArgument);
  EXPECT_THROW(one.inverse(1), InvalidArgument);
  std::vector<uint64_t> two(2);
  EXPECT_THROW(one.permute(0, two), InvalidArgument);
  EXPECT_THROW(KeyedPermutation(KeyedPermutation::kMaxSize + 1, 0, 0), InvalidArgument);
}

}  // namespace
}  // namespace zerodp
