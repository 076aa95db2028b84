#include "core/partition.h"

#include <algorithm>

#include <fmt/core.h>

#include "core/error.h"

namespace zerodp {

Range balanced_range(size_t length, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw InvalidArgument(
        fmt::format("partition: rank {} of world {} is invalid; use 0 to world - 1", rank, world));
  }
  const size_t n = static_cast<size_t>(world), r = static_cast<size_t>(rank);
  const size_t base = length / n, extra = length % n;
  const size_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

Partition::Partition(size_t length, int world) {
  if (world < 1) {
    throw InvalidArgument(fmt::format("partition: world size {} is invalid; use 1 or more", world));
  }
  const size_t n = static_cast<size_t>(world);
  const size_t base = length / n;
  const size_t extra = length % n;
  offsets_.assign(n + 1, 0);
  for (size_t r = 0; r < n; ++r) offsets_[r + 1] = offsets_[r] + base + (r < extra ? 1 : 0);
}

Partition Partition::from_counts(std::span<const size_t> counts) {
  if (counts.empty()) {
    throw InvalidArgument("partition: no ranks given; counts must name at least one rank");
  }
  Partition p;
  p.offsets_.assign(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) p.offsets_[r + 1] = p.offsets_[r] + counts[r];
  return p;
}

Partition Partition::aligned(size_t length, int world, size_t grain) {
  if (grain < 1) {
    throw InvalidArgument(fmt::format("partition: grain {} is invalid; use 1 or more", grain));
  }
  Partition p((length + grain - 1) / grain, world);
  for (size_t& o : p.offsets_) o = std::min(o * grain, length);
  return p;
}

int Partition::owner(size_t index) const {
  if (index >= length()) {
    throw InvalidArgument(
        fmt::format("partition: index {} is outside a buffer of {} elements", index, length()));
  }
  // The owner is the last rank whose offset is <= index among non-empty ranges.
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), index);
  return static_cast<int>(it - offsets_.begin()) - 1;
}

size_t Partition::max_count() const {
  size_t m = 0;
  for (int r = 0; r < world_size(); ++r) m = std::max(m, count(r));
  return m;
}

size_t Partition::check(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw InvalidArgument(
        fmt::format("partition: rank {} is outside world of {} ranks", rank, world_size()));
  }
  return static_cast<size_t>(rank);
}

}  // namespace zerodp
