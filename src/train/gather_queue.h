// Stage 3's parameter gathers, run ahead of compute: a unit's parameters are all-gathered
// into one of the slots (1 + --prefetch of them) before its forward or backward needs them,
// up to `prefetch` units ahead of the one computing, in the order the pass visits them.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.h"
#include "train/sharded_state.h"

namespace zerodp {

class GatherQueue {
 public:
  // Issues the first gathers at once. `order`: the unit indices in the order of the pass.
  GatherQueue(Communicator& comm, std::vector<UnitState>& units, std::vector<Flat>& slots,
              std::vector<size_t> order);
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
  std::vector<Work> works_;
  size_t issued_ = 0;
};

}  // namespace zerodp
