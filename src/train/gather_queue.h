// Stage 3's parameter gathers, run ahead of compute: a unit's parameters are all-gathered
// into one of the slots (1 + --prefetch of them) before its forward or backward needs them,
// up to `prefetch` units ahead of the one computing, in the order the pass visits them.
#pragma once

#include <cstddef>
#include <functional>
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

class GatherQueue {
 public:
  // Issues the first gathers at once. `order`: the unit indices in the order of the pass.
  // With `hpz`, units are gathered from the node's copy; else with `qwz`, quantized; else
  // from `offload` when it holds the parameter shards (each read into its place in the slot
  // before its gather is issued). `before_issue(u)` runs before unit u's gather is issued
  // (the offload tier's overlapped update: the unit's parameters must be updated first).
  GatherQueue(ShardGroup& group, std::vector<UnitState>& units, std::vector<Flat>& slots,
              std::vector<size_t> order, HpzCopy* hpz = nullptr, QuantizedGather* qwz = nullptr,
              OffloadTier* offload = nullptr, std::function<void(size_t)> before_issue = {});
  // Waits for the i-th unit of the order to arrive; returns its slot.
  int acquire(size_t i);
  // The i-th unit is done with its slot: the next gather may reuse it.
  void release(size_t i);
  // Waits for reads still queued (their errors dropped: the caller is unwinding or done).
  ~GatherQueue();
  GatherQueue(const GatherQueue&) = delete;
  GatherQueue& operator=(const GatherQueue&) = delete;

 private:
  void issue();
  // From the offload file a unit's shard is read into its slot once the slot is free, and
  // its gather issued one release later (at the latest when acquired), so the read runs
  // beside a unit's compute and, from --prefetch 2 on, the gather beside the next one's.
  // Issued at fixed points of the pass, never when a read happens to finish: every rank
  // must issue its collectives in one order. Issues the gathers through index `through`,
  // waiting for their reads.
  void start_gathers(size_t through);
  ShardGroup& group_;
  std::vector<UnitState>& units_;
  std::vector<Flat>& slots_;
  std::vector<size_t> order_;
  HpzCopy* hpz_;
  QuantizedGather* qwz_;
  OffloadTier* offload_;
  std::function<void(size_t)> before_issue_;
  std::vector<Work> works_;
  std::vector<OffloadTier::PendingRead> reads_;  // per index of the order, from the file
  size_t issued_ = 0;
  size_t gathering_ = 0;  // gathers issued (issued_ unless reading from the file)
};

}  // namespace zerodp
