// Stage 3's parameter gathers, run ahead of compute: a unit's parameters are all-gathered
// into one of the slots (1 + --prefetch of them) before its forward or backward needs them,
// up to `prefetch` units ahead of the one computing, in the order the pass visits them.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.h"
#include "train/sharded_state.h"

namespace zerodp {

// hpZ (ZeRO++'s hierarchical partitioning): once the forward has gathered a unit, each rank
// keeps its share of it within its node (local index rank % T of Partition(numel, T)), so
// the backward can gather the unit from the node's T ranks instead of from owners on every
// node. The parameters do not change between a step's forwards and backwards, so the
// backward sees the same bits. Costs the parameters' bytes / T per rank (hpz_params).
class HpzCopy {
 public:
  HpzCopy(const std::vector<UnitState>& units, std::vector<Flat>& shards, int node_ranks, int rank);
  // Copies this rank's share of unit `u` out of its gathered parameters.
  void keep(size_t u, const Flat& gathered);
  // Gathers unit `u` into `slot` from the node's shares.
  Work gather(Communicator& comm, size_t u, Flat& slot);

 private:
  std::vector<Partition> parts_;
  std::vector<Flat>& shards_;
  int local_;
};

class GatherQueue {
 public:
  // Issues the first gathers at once. `order`: the unit indices in the order of the pass.
  // With `hpz`, units are gathered from the node's copy.
  GatherQueue(Communicator& comm, std::vector<UnitState>& units, std::vector<Flat>& slots,
              std::vector<size_t> order, HpzCopy* hpz = nullptr);
  // Waits for the i-th unit of the order to arrive; returns its slot.
  int acquire(size_t i);
  // The i-th unit is done with its slot: the next gather may reuse it.
  void release(size_t i);

 private:
  void issue();
  Communicator& comm_;
  std::vector<UnitState>& units_;
  std::vector<Flat>& slots_;
  std::vector<size_t> order_;
  HpzCopy* hpz_;
  std::vector<Work> works_;
  size_t issued_ = 0;
};

}  // namespace zerodp
