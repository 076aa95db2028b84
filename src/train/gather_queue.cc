// gather_queue.h is the contract.
#include "train/gather_queue.h"

#include <cstring>

namespace zerodp {

HpzCopy::HpzCopy(const std::vector<UnitState>& units, std::vector<Flat>& shards, int node_ranks,
                 int rank)
    : shards_(shards), local_(rank % node_ranks) {
  for (const UnitState& u : units) parts_.emplace_back(u.numel, node_ranks);
}

void HpzCopy::keep(size_t u, const Flat& gathered) {
  Flat& shard = shards_[u];
  const size_t w = dtype_size(shard.dtype);
  if (shard.count > 0)
    std::memcpy(shard.data(), gathered.at(parts_[u].offset(local_)), shard.count * w);
}

Work HpzCopy::gather(Communicator& comm, size_t u, Flat& slot) {
  return comm.node_all_gather_async(shards_[u].buffer(), slot.range(0, parts_[u].length()),
                                    parts_[u]);
}

GatherQueue::GatherQueue(Communicator& comm, std::vector<UnitState>& units,
                         std::vector<Flat>& slots, std::vector<size_t> order, HpzCopy* hpz)
    : comm_(comm), units_(units), slots_(slots), order_(std::move(order)), hpz_(hpz) {
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
  works_.push_back(hpz_
                       ? hpz_->gather(comm_, order_[issued_], slot)
                       : comm_.all_gather_async(u.params.buffer(), slot.range(0, u.numel), u.part));
  ++issued_;
}

}  // namespace zerodp
