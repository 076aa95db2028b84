// Partition: a buffer of `length` elements split over `world` ranks into contiguous ranges.
//
// One type drives every sharded operation: reduce-scatter and all-gather ranges, the
// optimizer's shard, checkpoint shards and resharding. Ranges may differ in length (the
// first length % world ranks hold one element more), and when length < world the last
// ranks hold empty ranges. Immutable and cheap to copy.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace zerodp {

struct Range {
  size_t begin = 0;
  size_t end = 0;
  size_t count() const { return end - begin; }
  bool empty() const { return begin == end; }
  bool operator==(const Range&) const = default;
};

// Rank `rank`'s range of Partition(length, world), in O(1): for callers that want one range
// of a split into very many (Streaming DiLoCo's fragments), where building the split would
// cost O(world) per range.
Range balanced_range(size_t length, int world, int rank);

class Partition {
 public:
  Partition() = default;
  // Balanced split. Throws InvalidArgument if world < 1.
  Partition(size_t length, int world);
  // Explicit counts per rank, in rank order.
  static Partition from_counts(std::span<const size_t> counts);
  // Cut only at multiples of `grain` (and at `length`): the ceil(length / grain) grains split
  // as the balanced split splits elements, the last grain short. grain 1 is the balanced split.
  // --optimizer-states int8 shards so, so that no block of 8-bit moments spans two ranks.
  static Partition aligned(size_t length, int world, size_t grain);

  size_t length() const { return offsets_.empty() ? 0 : offsets_.back(); }
  int world_size() const { return static_cast<int>(offsets_.size()) - 1; }
  size_t count(int rank) const { return offsets_[check(rank) + 1] - offsets_[check(rank)]; }
  size_t offset(int rank) const { return offsets_[check(rank)]; }
  Range range(int rank) const { return {offset(rank), offset(rank) + count(rank)}; }
  // The rank whose range holds `index` (index < length()).
  int owner(size_t index) const;
  size_t max_count() const;

  bool operator==(const Partition&) const = default;

 private:
  size_t check(int rank) const;
  std::vector<size_t> offsets_{0};  // world + 1 entries; offsets_[r]..offsets_[r+1] is rank r
};

}  // namespace zerodp
