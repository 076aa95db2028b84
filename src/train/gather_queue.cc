// gather_queue.h is the contract.
#include "train/gather_queue.h"

namespace zerodp {

GatherQueue::GatherQueue(Communicator& comm, std::vector<UnitState>& units,
                         std::vector<Flat>& slots, std::vector<size_t> order)
    : comm_(comm), units_(units), slots_(slots), order_(std::move(order)) {
  while (issued_ < order_.size() && issued_ < slots_.size()) issue();
}

int GatherQueue::acquire(size_t i) {
  works_[i].wait();
  return static_cast<int>(i % slots_.size());
}

void GatherQueue::release(size_t) {
  if (issued_ < order_.size()) issue();
}

void GatherQueue::issue() {
  UnitState& u = units_[order_[issued_]];
  Flat& slot = slots_[issued_ % slots_.size()];
  works_.push_back(comm_.all_gather_async(u.params.buffer(), slot.range(0, u.numel), u.part));
  ++issued_;
}

}  // namespace zerodp
