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

QuantizedGather::QuantizedGather(const std::vector<UnitState>& units, std::vector<Flat>& staging,
                                 size_t block, int rank)
    : q_{.bits = QuantBits::kInt8, .block = block}, staging_(staging), rank_(rank) {
  for (const UnitState& u : units) {
    std::vector<size_t> bytes;
    for (int k = 0; k < u.part.world_size(); ++k)
      bytes.push_back(quantized_bytes(u.part.count(k), q_));
    payloads_.push_back(Partition::from_counts(bytes));
  }
}

Work QuantizedGather::issue(Communicator& comm, const UnitState& state, size_t u, size_t slot) {
  Flat& staging = staging_[slot];
  const Partition& bytes = payloads_[u];
  auto* own = static_cast<std::byte*>(staging.at(bytes.offset(rank_)));
  quantize(ConstBuffer(state.master_values()), std::span<std::byte>(own, bytes.count(rank_)), q_);
  return comm.all_gather_async(ConstBuffer(own, bytes.count(rank_), DType::kU8),
                               staging.range(0, bytes.length()), bytes);
}

void QuantizedGather::finish(const UnitState& state, size_t u, size_t slot, Flat& gathered) {
  const Flat& staging = staging_[slot];
  const Partition& bytes = payloads_[u];
  for (int k = 0; k < bytes.world_size(); ++k) {
    const auto* payload = static_cast<const std::byte*>(staging.at(bytes.offset(k)));
    dequantize(std::span<const std::byte>(payload, bytes.count(k)),
               gathered.range(state.part.offset(k), state.part.count(k)), q_);
  }
}

GatherQueue::GatherQueue(ShardGroup& group, std::vector<UnitState>& units, std::vector<Flat>& slots,
                         std::vector<size_t> order, HpzCopy* hpz, QuantizedGather* qwz,
                         OffloadTier* offload, std::function<void(size_t)> before_issue)
    : group_(group),
      units_(units),
      slots_(slots),
      order_(std::move(order)),
      hpz_(hpz),
      qwz_(qwz),
      // hpZ's gathers come from the node's copy in memory, whatever holds the shards.
      offload_(offload != nullptr && offload->holds_params() && hpz == nullptr ? offload : nullptr),
      before_issue_(std::move(before_issue)) {
  while (issued_ < order_.size() && issued_ < slots_.size()) issue();
  if (offload_ && slots_.size() >= 2) start_gathers(slots_.size() - 2);
}

GatherQueue::~GatherQueue() {
  for (OffloadTier::PendingRead& r : reads_) {
    try {
      offload_->finish(r);
    } catch (...) {  // the error, if it matters, was or will be reported by acquire
    }
  }
}

int GatherQueue::acquire(size_t i) {
  if (offload_) start_gathers(i);
  works_[i].wait();
  const size_t slot = i % slots_.size();
  if (!hpz_ && qwz_) qwz_->finish(units_[order_[i]], order_[i], slot, slots_[slot]);
  return static_cast<int>(slot);
}

void GatherQueue::release(size_t i) {
  if (issued_ < order_.size()) issue();
  if (offload_) start_gathers(i + slots_.size() - 1);
}

void GatherQueue::start_gathers(size_t through) {
  for (; gathering_ < issued_ && gathering_ <= through; ++gathering_) {
    offload_->finish(reads_[gathering_]);
    UnitState& u = units_[order_[gathering_]];
    Flat& slot = slots_[gathering_ % slots_.size()];
    // In place: the read put the shard at its range of the gathered unit.
    works_[gathering_] = group_.all_gather_async(slot.range(u.own.begin, u.own.count()),
                                                 slot.range(0, u.numel), u.part);
  }
}

void GatherQueue::issue() {
  if (before_issue_) before_issue_(order_[issued_]);
  UnitState& u = units_[order_[issued_]];
  Flat& slot = slots_[issued_ % slots_.size()];
  if (hpz_) {
    works_.push_back(hpz_->gather(group_.comm(), order_[issued_], slot));
  } else if (qwz_) {
    works_.push_back(qwz_->issue(group_.comm(), u, order_[issued_], issued_ % slots_.size()));
  } else if (offload_) {
    // The file's worker reads the shard into its range of the slot while compute runs;
    // start_gathers issues the gather once it is there.
    reads_.push_back(offload_->read_params_async(order_[issued_], slot.at(u.own.begin)));
    works_.emplace_back();
  } else {
    works_.push_back(group_.all_gather_async(u.params.buffer(), slot.range(0, u.numel), u.part));
  }
  ++issued_;
}

}  // namespace zerodp
