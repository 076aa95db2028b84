// DiLoCo's outer step (Douillard et al., arXiv 2311.08105), streamed in fragments as
// Streaming DiLoCo (arXiv 2501.18512) does; docs/diloco.md. The world is I islands of n
// consecutive ranks; each island trains on its own with its states sharded over its ranks
// (a ShardGroup on the island's communicator), and rank l of every island owns the same
// range of each unit. Those I ranks form a column, and the outer step is theirs alone, on
// the own range:
//
//   delta_i = global - master_i            (island i's pseudo-gradient, fp32)
//   avg     = (delta_0 + ... + delta_{I-1}) / I, folded in island order in fp32
//   mom     = mu * mom + avg
//   global  = global - lr * (avg + mu * mom)      (Nesterov, as torch.optim.SGD's)
//   master_i = global, or after a delayed exchange alpha * global + (1 - alpha) * master_i;
//              the 16-bit parameters rounded from it, the island's full copies gathered
//              again where the stage keeps them (params at stages 0-2, the master at
//              stage 0); AdamW's moments are kept.
//
// Fragments (--fragments F, F dividing H): fragment f is the elements
// [f P / F, (f + 1) P / F) of the model's P parameters, units concatenated in order, and
// its round ends after the steps t with t = f H / F (mod H): its exchange starts then, and
// is merged tau = --outer-delay steps later (after that step's inner update; tau < H / F,
// so one fragment is in flight at a time), overlapping the steps between. F = 1, tau = 0
// is DiLoCo. The run's last step ends every fragment's round at once, so it ends on the
// global weights.
//
// With --outer-quant int8 or int4 the pseudo-gradients cross the column as blocks of
// kOuterQuantBlock elements fixed in the fragment's coordinates, one fp32 scale each: a
// block's amax is the max over the island's ranks of their parts' (an all-reduce of one
// float per block inside the island), each island's codes and scales are all-gathered over
// the column, and every rank dequantizes them and folds them in island order in fp32.
//
// Every operation is elementwise on ranges fixed in the model's coordinates, so the result
// does not depend on n: for a fixed I, island batch, H, F and tau, any ranks per island give
// the same bits, and no step's bits depend on when an exchange finished. The outer state is
// the global weights and the momentum (8 bytes per owned element) and the exchange's buffer
// (4 bytes per owned element of the largest fragment), and with --outer-quant the block
// maxima, one packed payload per island and its own codes: outer_state in the ledger, sized
// by outer_layout (train/outer_layout.h), as the planner sizes it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "comm/quantize.h"
#include "memory/ledger.h"
#include "train/config.h"
#include "train/held_islands.h"
#include "train/outer_layout.h"
#include "train/plan.h"
#include "train/shard_group.h"
#include "train/sharded_state.h"
#include "train/state_store.h"

namespace zerodp {

// The fragments whose round ends after step `step` (1-based): at the run's last step every
// fragment, else those with step = f H / F (mod H).
std::vector<int> fragments_ending(const TrainConfig& cfg, int64_t step);
// Elements of fragment f, [begin, end), in the model's flat coordinates over `total`.
Range fragment_range(uint64_t total, int fragments, int f);

class OuterStep {
 public:
  // `column`: the ranks of this rank's index in every island, in island order.
  // `store`: where the master weights (at fp32 the params) are, in memory or offloaded.
  // `held`: the islands whose states `state` and `store` show, one at a time. Islands in turn
  // (--islands-in-turn): the column is this rank alone, which holds every island's states;
  // the pseudo-gradients then fold in memory, in island order, as the column's all-reduce
  // does.
  OuterStep(const TrainConfig& cfg, ShardedState& state, StateStore& store, ShardGroup& island,
            Communicator& column, MemoryLedger& ledger, HeldIslands& held);
  // Waits for an exchange still in flight (a run stopped mid-round): the column's thread
  // writes into the exchange buffer until it is done. Its error is dropped: the caller is
  // unwinding, and a failed peer aborts the column, which ends the wait.
  ~OuterStep();
  OuterStep(const OuterStep&) = delete;
  OuterStep& operator=(const OuterStep&) = delete;

  // The global weights from the states as they stand: at a fresh start, once the initial
  // weights are in place (every island starts from the same ones).
  void begin();
  // After step `step`'s inner update (the caller has settled it): merges the exchange due
  // now and starts those whose round ends now (collective over the column, then the island).
  // Returns whether it did either.
  bool after_step(int64_t step);
  // Whether after_step(step) will act.
  bool due(int64_t step) const {
    return (pending_ >= 0 && (step == merge_at_ || step == cfg_.steps)) ||
           !fragments_ending(cfg_, step).empty();
  }

  // The own range of unit u's global weights and momentum (checkpoints).
  std::span<float> global(size_t u) { return global_[u].span(); }
  std::span<float> momentum(size_t u) { return momentum_[u].span(); }
  std::span<const float> global(size_t u) const { return {global_[u].data(), global_[u].size()}; }
  std::span<const float> momentum(size_t u) const {
    return {momentum_[u].data(), momentum_[u].size()};
  }
  // The exchange in flight after step `step` (its all-reduce waited for), or nothing. A
  // checkpoint saves its averaged pseudo-gradient (`pending_values`, scattered over each
  // unit's own range, zeros elsewhere) and a resume puts it back with restore_pending.
  std::optional<int> in_flight(int64_t step);
  void pending_values(size_t u, std::span<float> own) const;
  void restore_pending(int64_t step, size_t u, std::span<const float> own);

 private:
  // A fragment's part of unit `unit`'s own range: elements [at, at + count) of it.
  struct Piece {
    size_t unit = 0;
    size_t at = 0;
    size_t count = 0;
    uint64_t rel = 0;      // its first element's place in the fragment
    size_t buffer_at = 0;  // its place in the exchange buffer (the fragment's pieces in order)
  };
  // With --outer-quant, fragment f's sizes: its blocks in the model, those this rank's
  // elements touch (one scale each in its payload), and its elements.
  struct Quantized {
    size_t blocks = 0;
    size_t touched = 0;
    size_t count = 0;
    size_t payload = 0;  // bytes: the touched blocks' scales, then the packed codes
  };
  // The buffers' sizes as the pieces and the state give them, which must be the planned ones
  // (outer_layout) the buffers are allocated by: a piece past its buffer would write outside it.
  OuterLayout pieces_layout() const;
  // The store's jobs for fragment f's pieces of the master (at fp32 the params), with
  // `arrays` (kMaster, and kParams where the merge narrows into them).
  std::vector<StateStore::Job> master_jobs(int f, unsigned arrays) const;
  // Unit u's own range of its fp32 master in memory (stage 0's gather source).
  std::span<float> own_master(UnitState& u);
  // Stage 0 at 16 bits offloaded: the island's ranks each hold the whole master in the file,
  // so a merge gathers unit i's through `whole_master_` and writes it back whole.
  bool gathers_offloaded_master() const;
  void gather_offloaded_master(size_t i);
  // Fragment f's pseudo-gradient into the exchange buffer, its all-reduce issued.
  void send(int f, int64_t merge_at);
  QuantBits quant_bits() const;
  // The islands this rank holds (islands in turn), else 1.
  int hosted() const { return hosted_islands(cfg_); }
  // The quantized exchange of the first `count` elements of the exchange buffer, island
  // `island`'s payload (the one this rank holds unless islands in turn).
  void send_quantized(int f, int island);
  // Waits for the exchange in flight and, quantized, folds the islands' payloads into the
  // exchange buffer: then it holds the average.
  void finish_exchange();
  // Calls fn(at, n, block, k) for the runs of fragment f's own elements (at: their place in
  // the exchange buffer) that lie in one block (k: its place among the touched blocks).
  template <typename Fn>
  void for_each_block_run(int f, Fn&& fn) const;
  // The exchange's outer step and merge into the island's weights (`mix`: the global
  // weights' share).
  void merge(float mix);
  // The merge into the active island's weights, after the outer update of the global
  // weights and momentum when `outer_update` (once per merge, however many islands).
  void merge_island(float mix, bool outer_update);
  // The step whose round end starts the exchange merged after `step`, if one is in flight.
  std::optional<int64_t> sent_before(int64_t step) const;

  const TrainConfig& cfg_;
  ShardedState& state_;
  StateStore& store_;
  ShardGroup& island_;
  Communicator& column_;
  HeldIslands& held_;
  std::vector<Buffer<float>> global_, momentum_;
  std::vector<std::vector<Piece>> fragments_;
  // The units each fragment overlaps in the model (the same on every rank of an island,
  // whose own pieces of it differ): those whose island copies a merge gathers again.
  std::vector<std::vector<size_t>> touched_;
  Buffer<float> exchange_;            // the fragment in flight's pseudo-gradient, then its average
  Buffer<float> whole_master_;        // the largest unit's master (gathers_offloaded_master)
  std::vector<Quantized> quantized_;  // per fragment, with --outer-quant
  Buffer<float> amax_;                // a fragment's block maxima
  Buffer<int8_t> codes_;              // this rank's codes, and an island's unpacked
  Buffer<uint8_t> payload_;           // this rank's payload
  Buffer<uint8_t> gathered_;          // every island's, in island order
  bool folded_ = true;                // whether the exchange buffer holds the average
  int pending_ = -1;                  // the fragment in flight
  int64_t merge_at_ = 0;
  std::vector<Work> works_;
};

}  // namespace zerodp
