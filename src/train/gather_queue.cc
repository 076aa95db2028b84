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

namespace {

class OwnersGather final : public GatherSource {
 public:
  OwnersGather(ShardGroup& group, std::vector<UnitState>& units) : group_(group), units_(units) {}
  void issue(size_t, size_t u, size_t, Flat& slot) override {
    UnitState& unit = units_[u];
    works_.push_back(
        group_.all_gather_async(unit.params.buffer(), slot.range(0, unit.numel), unit.part));
  }

 private:
  ShardGroup& group_;
  std::vector<UnitState>& units_;
};

class NodeCopyGather final : public GatherSource {
 public:
  NodeCopyGather(HpzCopy& hpz, Communicator& comm) : hpz_(hpz), comm_(comm) {}
  void issue(size_t, size_t u, size_t, Flat& slot) override {
    works_.push_back(hpz_.gather(comm_, u, slot));
  }

 private:
  HpzCopy& hpz_;
  Communicator& comm_;
};

class QuantizedGatherSource final : public GatherSource {
 public:
  QuantizedGatherSource(QuantizedGather& qwz, Communicator& comm, std::vector<UnitState>& units)
      : qwz_(qwz), comm_(comm), units_(units) {}
  void issue(size_t, size_t u, size_t s, Flat&) override {
    works_.push_back(qwz_.issue(comm_, units_[u], u, s));
  }

 private:
  void finish(size_t u, size_t s, Flat& slot) override { qwz_.finish(units_[u], u, s, slot); }
  QuantizedGather& qwz_;
  Communicator& comm_;
  std::vector<UnitState>& units_;
};

class FileGather final : public GatherSource {
 public:
  FileGather(OffloadTier& file, ShardGroup& group, std::vector<UnitState>& units)
      : file_(file), group_(group), units_(units) {}
  // Waits for reads still queued (their errors dropped: the caller is unwinding or done).
  ~FileGather() override {
    for (OffloadTier::PendingRead& r : reads_) {
      try {
        file_.finish(r);
      } catch (...) {  // the error, if it matters, was or will be reported by wait
      }
    }
  }
  // The file's worker reads the shard into its range of the slot while compute runs;
  // reached() issues the gather once it is there.
  void issue(size_t, size_t u, size_t, Flat& slot) override {
    reads_.push_back(file_.read_params_async(u, slot.at(units_[u].own.begin)));
    units_of_.push_back(u);
    slots_of_.push_back(&slot);
    works_.emplace_back();
  }
  // Issued at fixed points of the pass, never when a read happens to finish: every rank
  // must issue its collectives in one order.
  void reached(size_t through) override {
    for (; gathering_ < reads_.size() && gathering_ <= through; ++gathering_) {
      file_.finish(reads_[gathering_]);
      UnitState& u = units_[units_of_[gathering_]];
      Flat& slot = *slots_of_[gathering_];
      // In place: the read put the shard at its range of the gathered unit.
      works_[gathering_] = group_.all_gather_async(slot.range(u.own.begin, u.own.count()),
                                                   slot.range(0, u.numel), u.part);
    }
  }

 private:
  OffloadTier& file_;
  ShardGroup& group_;
  std::vector<UnitState>& units_;
  std::vector<OffloadTier::PendingRead> reads_;  // per index of the pass
  std::vector<size_t> units_of_;
  std::vector<Flat*> slots_of_;
  size_t gathering_ = 0;  // gathers issued
};

}  // namespace

std::unique_ptr<GatherSource> gather_from_owners(ShardGroup& group, std::vector<UnitState>& units) {
  return std::make_unique<OwnersGather>(group, units);
}
std::unique_ptr<GatherSource> gather_from_node_copy(HpzCopy& hpz, Communicator& comm) {
  return std::make_unique<NodeCopyGather>(hpz, comm);
}
std::unique_ptr<GatherSource> gather_quantized(QuantizedGather& qwz, Communicator& comm,
                                               std::vector<UnitState>& units) {
  return std::make_unique<QuantizedGatherSource>(qwz, comm, units);
}
std::unique_ptr<GatherSource> gather_from_file(OffloadTier& file, ShardGroup& group,
                                               std::vector<UnitState>& units) {
  return std::make_unique<FileGather>(file, group, units);
}

GatherQueue::GatherQueue(std::vector<Flat>& slots, std::vector<size_t> order,
                         std::unique_ptr<GatherSource> source,
                         std::function<void(size_t)> before_issue)
    : slots_(slots),
      order_(std::move(order)),
      source_(std::move(source)),
      before_issue_(std::move(before_issue)) {
  while (issued_ < order_.size() && issued_ < slots_.size()) issue();
  if (slots_.size() >= 2) source_->reached(slots_.size() - 2);
}

int GatherQueue::acquire(size_t i) {
  const size_t s = i % slots_.size();
  source_->wait(i, order_[i], s, slots_[s]);
  return static_cast<int>(s);
}

void GatherQueue::release(size_t i) {
  if (issued_ < order_.size()) issue();
  source_->reached(i + slots_.size() - 1);
}

void GatherQueue::issue() {
  if (before_issue_) before_issue_(order_[issued_]);
  const size_t s = issued_ % slots_.size();
  source_->issue(issued_, order_[issued_], s, slots_[s]);
  ++issued_;
}

}  // namespace zerodp
