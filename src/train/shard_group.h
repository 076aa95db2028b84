// The ranks a unit's states are sharded over, and the two collectives that keep them: the
// whole world (ZeRO), the T ranks of each node, each node holding a replica
// (--shard-within-node, HSDP), or a DiLoCo island's ranks. Every sharding collective of the step
// goes through here, so the rest of the engine asks one question, "my range of Partition(numel,
// size())".
#pragma once

#include "comm/communicator.h"
#include "core/partition.h"
#include "train/config.h"

namespace zerodp {

class ShardGroup {
 public:
  ShardGroup(Communicator& comm, const TrainConfig& cfg)
      : comm_(comm),
        within_node_(cfg.shard_within_node),
        size_(within_node_ ? cfg.launch.comm.node_ranks : comm.size()),
        index_(within_node_ ? comm.rank() % size_ : comm.rank()) {}
  // A DiLoCo island (--islands): the states sharded over the island's own communicator, each
  // island holding its own (train/outer_step.h keeps them in step).
  explicit ShardGroup(Communicator& island)
      : comm_(island), within_node_(false), size_(island.size()), index_(island.rank()) {}

  Communicator& comm() { return comm_; }
  // Ranks one copy of the states is spread over, and this rank's place among them.
  int size() const { return size_; }
  int index() const { return index_; }
  // Whether other nodes hold the same ranges (so world-wide sums over owned ranges, such as
  // the gradient norm's, must count one node's only, and one node writes the checkpoint).
  bool replicated() const { return within_node_ && size_ < comm_.size(); }
  // Whether this rank's ranges are the copy that counts: always, or under HSDP node 0's
  // ranks (ranks 0 .. T - 1, whose index is their rank).
  bool primary() const { return !replicated() || comm_.rank() < size_; }

  // The reduce-scatter of a gradient over `part` (size() ranges): this rank's range of the
  // world's reduction.
  Work reduce_scatter_async(ConstBuffer in, MutableBuffer out, const Partition& part, ReduceOp op) {
    return within_node_ ? comm_.node_reduce_scatter_async(in, out, part, op)
                        : comm_.reduce_scatter_async(in, out, part, op);
  }
  // The all-gather of the shards of `part` into the whole unit.
  Work all_gather_async(ConstBuffer shard, MutableBuffer out, const Partition& part) {
    return within_node_ ? comm_.node_all_gather_async(shard, out, part)
                        : comm_.all_gather_async(shard, out, part);
  }

 private:
  Communicator& comm_;
  bool within_node_;
  int size_;
  int index_;
};

}  // namespace zerodp
