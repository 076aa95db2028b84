// DiLoCo's outer step (Douillard et al., arXiv 2311.08105; docs/diloco.md). The world is
// I islands of n consecutive ranks; each island trains on its own with its states sharded
// over its ranks (a ShardGroup on the island's communicator), and rank l of every island
// owns the same range of each unit. Those I ranks form a column, and the outer step is
// theirs alone, on the own range:
//
//   delta_i = global - master_i            (island i's pseudo-gradient, fp32)
//   avg     = (delta_0 + ... + delta_{I-1}) / I, folded in island order in fp32
//   mom     = mu * mom + avg
//   global  = global - lr * (avg + mu * mom)      (Nesterov, as torch.optim.SGD's)
//   master_i = global, the 16-bit parameters rounded from it, the island's full copies
//              gathered again where the stage keeps them (params at stages 0-2, the
//              master at stage 0); AdamW's moments are kept.
//
// Every operation is elementwise on a range every island partitions alike, so the result
// does not depend on n: for a fixed I, island batch and H, any ranks per island give the
// same bits. The global weights and the momentum (8 bytes per owned element) are the
// outer state, in the ledger as outer_state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "memory/ledger.h"
#include "train/config.h"
#include "train/shard_group.h"
#include "train/sharded_state.h"

namespace zerodp {

class OuterStep {
 public:
  // `column`: the ranks of this rank's index in every island, in island order.
  OuterStep(const TrainConfig& cfg, ShardedState& state, ShardGroup& island, Communicator& column,
            MemoryLedger& ledger);

  // The global weights from the states as they stand: at a fresh start, once the initial
  // weights are in place (every island starts from the same ones).
  void begin();
  // Whether step `step` (1-based) ends with an outer step: every outer_every steps, and the
  // run's last (a final partial round, so the run ends on the global weights).
  bool due(int64_t step) const { return step % cfg_.outer_every == 0 || step == cfg_.steps; }
  // The outer step; collective over the column, then over the island. The caller has
  // settled the inner update.
  void apply();

  // The own range of unit u's global weights and momentum (checkpoints).
  std::span<float> global(size_t u) { return global_[u].span(); }
  std::span<float> momentum(size_t u) { return momentum_[u].span(); }
  int64_t outer_steps() const { return outer_steps_; }
  void set_outer_steps(int64_t n) { outer_steps_ = n; }

 private:
  // Unit u's own range of its fp32 master (the params themselves at fp32).
  std::span<float> own_master(UnitState& u);

  const TrainConfig& cfg_;
  ShardedState& state_;
  ShardGroup& island_;
  Communicator& column_;
  MemoryLedger& ledger_;
  std::vector<Buffer<float>> global_, momentum_;
  size_t owned_ = 0;  // elements this rank owns over all units
  int64_t outer_steps_ = 0;
};

}  // namespace zerodp
