// Stage 3's parameter gathers, run ahead of compute: a unit's parameters are all-gathered
// into one of the slots (1 + --prefetch of them) before its forward or backward needs them,
// up to `prefetch` units ahead of the one computing, in the order the pass visits them.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/quantize.h"
#include "train/offload.h"
#include "train/shard_group.h"
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

// qwZ (ZeRO++'s quantized weights): the owner quantizes its shard from its fp32 master into
// int8 blocks with an fp32 scale each (comm/quantize.h), the world all-gathers the payloads
// (quantized_bytes(c_k) bytes from rank k), and every rank, the owner too, dequantizes all
// of them into the gathered unit, so every rank computes with the same weights.
class QuantizedGather {
 public:
  QuantizedGather(const std::vector<UnitState>& units, std::vector<Flat>& staging, size_t block,
                  int rank);
  // Quantizes unit `u`'s own shard into the staging of gather slot `slot` and issues the
  // gather of every rank's payload there.
  Work issue(Communicator& comm, const UnitState& state, size_t u, size_t slot);
  // Dequantizes the payloads in `slot`'s staging into `gathered`, unit `u`'s parameters.
  void finish(const UnitState& state, size_t u, size_t slot, Flat& gathered);

 private:
  BlockQuant q_;
  std::vector<Partition> payloads_;  // per unit: the bytes of every rank's payload
  std::vector<Flat>& staging_;
  int rank_;
};

// How a pass brings each unit's parameters into a gather slot: from the owners' shards
// (all-gather), from the node's hpZ copy, as the owners' quantized payloads (qwZ), or read
// from the offload file first and then gathered. One per pass, chosen by the trainer
// (RankTrainer::gather_source); GatherQueue only decides when.
class GatherSource {
 public:
  virtual ~GatherSource() = default;
  // Starts bringing unit `u`, the i-th of the pass (i = 0, 1, ... in turn), into `slot`,
  // gather slot number `s`.
  virtual void issue(size_t i, size_t u, size_t s, Flat& slot) = 0;
  // The pass reached a fixed point where gathers through the i-th may be issued (the file's
  // are issued only once their reads are in; every rank reaches the same points).
  virtual void reached(size_t /*i*/) {}
  // Waits until the i-th unit, `u`, is whole in `slot`.
  void wait(size_t i, size_t u, size_t s, Flat& slot) {
    reached(i);
    works_[i].wait();
    finish(u, s, slot);
  }

 protected:
  // After the gather arrived (qwZ dequantizes here).
  virtual void finish(size_t /*u*/, size_t /*s*/, Flat& /*slot*/) {}
  std::vector<Work> works_;  // per index of the pass
};

std::unique_ptr<GatherSource> gather_from_owners(ShardGroup& group, std::vector<UnitState>& units);
std::unique_ptr<GatherSource> gather_from_node_copy(HpzCopy& hpz, Communicator& comm);
std::unique_ptr<GatherSource> gather_quantized(QuantizedGather& qwz, Communicator& comm,
                                               std::vector<UnitState>& units);
// Each unit's shard is read into its place in the slot once the slot is free, and its
// gather issued one release later (at the latest when acquired), so the read runs beside a
// unit's compute and, from --prefetch 2 on, the gather beside the next one's.
std::unique_ptr<GatherSource> gather_from_file(OffloadTier& file, ShardGroup& group,
                                               std::vector<UnitState>& units);

class GatherQueue {
 public:
  // Issues the first gathers at once. `order`: the unit indices in the order of the pass.
  // `before_issue(u)` runs before unit u's gather is issued (the offload tier's overlapped
  // update: the unit's parameters must be updated first).
  GatherQueue(std::vector<Flat>& slots, std::vector<size_t> order,
              std::unique_ptr<GatherSource> source, std::function<void(size_t)> before_issue = {});
  // Waits for the i-th unit of the order to arrive; returns its slot.
  int acquire(size_t i);
  // The i-th unit is done with its slot: the next gather may reuse it.
  void release(size_t i);
  GatherQueue(const GatherQueue&) = delete;
  GatherQueue& operator=(const GatherQueue&) = delete;

 private:
  void issue();
  std::vector<Flat>& slots_;
  std::vector<size_t> order_;
  std::unique_ptr<GatherSource> source_;
  std::function<void(size_t)> before_issue_;
  size_t issued_ = 0;
};

}  // namespace zerodp
