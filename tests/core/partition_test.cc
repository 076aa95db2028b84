#include "core/partition.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace zerodp {
namespace {

TEST(Partition, RangesAreContiguousAndCoverTheBuffer) {
  for (int world = 1; world <= 9; ++world) {
    for (size_t length : {0u, 1u, 2u, 7u, 8u, 13u, 100u, 1000003u}) {
      const Partition p(length, world);
      ASSERT_EQ(p.world_size(), world);
      ASSERT_EQ(p.length(), length);
      size_t next = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(p.offset(r), next) << "world " << world << " length " << length;
        next += p.count(r);
      }
      EXPECT_EQ(next, length);
    }
  }
}

TEST(Partition, RaggedRangesDifferByAtMostOneAndLeadingRanksHoldMore) {
  const Partition p(10, 4);  // 3, 3, 2, 2
  EXPECT_EQ(p.count(0), 3u);
  EXPECT_EQ(p.count(1), 3u);
  EXPECT_EQ(p.count(2), 2u);
  EXPECT_EQ(p.count(3), 2u);
  EXPECT_EQ(p.max_count(), 3u);
}

TEST(Partition, FewerElementsThanRanksLeavesTrailingRangesEmpty) {
  const Partition p(2, 5);
  EXPECT_EQ(p.count(0), 1u);
  EXPECT_EQ(p.count(1), 1u);
  for (int r = 2; r < 5; ++r) {
    EXPECT_TRUE(p.range(r).empty());
    EXPECT_EQ(p.offset(r), 2u);
  }
}

TEST(Partition, OwnerFindsTheRankHoldingAnIndexEvenAcrossEmptyRanges) {
  const size_t counts[] = {2, 0, 0, 3, 0, 1};
  const Partition p = Partition::from_counts(counts);
  EXPECT_EQ(p.length(), 6u);
  const int expected[] = {0, 0, 3, 3, 3, 5};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(p.owner(i), expected[i]) << "index " << i;
  EXPECT_THROW((void)p.owner(6), InvalidArgument);
}

TEST(Partition, RejectsInvalidWorldAndRank) {
  EXPECT_THROW(Partition(10, 0), InvalidArgument);
  const Partition p(10, 3);
  EXPECT_THROW((void)p.count(3), InvalidArgument);
  EXPECT_THROW((void)p.offset(-1), InvalidArgument);
  try {
    (void)p.count(7);
    FAIL() << "rank 7 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 7"), std::string::npos) << e.what();
  }
}

TEST(Partition, EqualityComparesEveryRange) {
  const size_t a[] = {3, 3, 4};
  EXPECT_EQ(Partition(10, 3), Partition(10, 3));
  EXPECT_FALSE(Partition(10, 3) == Partition::from_counts(a));
}

}  // namespace
}  // namespace zerodp

namespace zerodp {
namespace {

// Aligned: every cut a multiple of the grain, the grains balanced like elements, grain 1 the
// balanced split itself.
TEST(Partition, AlignedCutsOnlyAtMultiplesOfTheGrain) {
  for (size_t length : {0u, 1u, 255u, 256u, 1000u, 4097u, 100000u}) {
    for (int world : {1, 2, 3, 7, 64}) {
      for (size_t grain : {1u, 3u, 256u}) {
        const Partition p = Partition::aligned(length, world, grain);
        ASSERT_EQ(p.world_size(), world);
        ASSERT_EQ(p.length(), length);
        const size_t grains = (length + grain - 1) / grain;
        const Partition g(grains, world);
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(p.offset(r) % grain == 0 || p.offset(r) == length)
              << length << " " << world << " " << grain << " rank " << r;
          EXPECT_EQ(p.offset(r), std::min(g.offset(r) * grain, length));
        }
      }
      EXPECT_EQ(Partition::aligned(length, world, 1), Partition(length, world));
    }
  }
  EXPECT_THROW((void)Partition::aligned(10, 2, 0), InvalidArgument);
}

}  // namespace
}  // namespace zerodp
