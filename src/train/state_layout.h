// What one rank holds of one unit's persistent states, as a table: each kind of state is one
// entry (its ledger category, bits per element, and how many elements rank r of the unit's
// partition keeps, in memory or in the offload file). `ShardedState` allocates its buffers
// from this table and the planner (train/plan.h, train/holdings.h) sums it, so what a rank
// allocates and what a forecast, the preflight and the report's plan say cannot drift.
//
// A new kind of state is one entry: its spec in `kStateEntrySpecs` (name, category, the range
// it covers), its count in `unit_layout`, a switch in `LayoutPlan` if an option enables it,
// and a buffer where the allocating code keeps it. Entries that no option enables yet are
// declared and sized zero (their arithmetic is tested), so the memory they will cost is
// decided before the code that uses them is written:
//   muon_momentum      Muon's per-matrix momentum: fp32, a whole matrix at one owner rank
//                      (the one whose range holds the matrix's first element; every rank at
//                      stage 0); Adam's moments then cover the other tensors only.
//   master_remainder   a 16-bit master's low half beside the 16-bit parameters (bf16 only: the
//   master_tie_bits    parameter is the master's rounded top half) and one bit per element
//                      saying whether that rounding went up, so the fp32 master is exact.
//   codes4_m, codes4_v 4-bit moments: two codes a byte over the quantized tensors' elements,
//   scales4_m, ..._v   an fp32 scale per block of the same kMomentBlock grid as 8-bit moments
//                      (so one aligned partition serves both).
//   error_feedback     a DiLoCo island's compression error of its own ranges, carried to the
//                      next outer step: fp32, per island the rank hosts (outer_state, beside
//                      the outer step's own buffers, train/outer_layout.h, once per rank).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/partition.h"
#include "memory/ledger.h"
#include "train/config.h"
#include "train/stage_plan.h"

namespace zerodp {

enum class StateEntry : uint8_t {
  kParams,  // the run's dtype: the held extent (kOwn at stage 3)
  kGrads,   // the run's dtype, fp32 where the grads are the canonical accumulator
  kMaster,  // fp32 over the optimizer range; none at fp32 (the params are the master)
  kAdamM,   // fp32 over the optimizer range; with 8-bit moments the small tensors' only
  kAdamV,
  kCodesM,  // 8-bit moments: a byte per element of the quantized tensors
  kCodesV,
  kScalesM,  // 8-bit moments: an fp32 scale per block
  kScalesV,
  kMuonMomentum,
  kMasterRemainder,
  kMasterTieBits,
  kCodes4M,
  kCodes4V,
  kScales4M,
  kScales4V,
  kErrorFeedback,
};
inline constexpr int kNumStateEntries = 17;

// The range of the unit an entry covers on a rank: the params' extent, the grads', the
// optimizer's (full or own, as the stage says), or always the own range.
enum class Covers : uint8_t { kParams, kGrads, kOptimizer, kOwn };
struct StateEntrySpec {
  std::string_view name;
  MemCategory category;  // the ledger category its buffer is charged to
  Covers covers;
};
// In StateEntry's order.
inline constexpr std::array<StateEntrySpec, kNumStateEntries> kStateEntrySpecs = {{
    {"params", MemCategory::kParams, Covers::kParams},
    {"grads", MemCategory::kGrads, Covers::kGrads},
    {"master", MemCategory::kMaster, Covers::kOptimizer},
    {"adam_m", MemCategory::kAdamM, Covers::kOptimizer},
    {"adam_v", MemCategory::kAdamV, Covers::kOptimizer},
    {"codes_m", MemCategory::kAdamM, Covers::kOptimizer},
    {"codes_v", MemCategory::kAdamV, Covers::kOptimizer},
    {"scales_m", MemCategory::kAdamM, Covers::kOptimizer},
    {"scales_v", MemCategory::kAdamV, Covers::kOptimizer},
    // Muon's momentum is the first moment of the matrices it takes.
    {"muon_momentum", MemCategory::kAdamM, Covers::kOptimizer},
    {"master_remainder", MemCategory::kMaster, Covers::kOptimizer},
    {"master_tie_bits", MemCategory::kMaster, Covers::kOptimizer},
    {"codes4_m", MemCategory::kAdamM, Covers::kOptimizer},
    {"codes4_v", MemCategory::kAdamV, Covers::kOptimizer},
    {"scales4_m", MemCategory::kAdamM, Covers::kOptimizer},
    {"scales4_v", MemCategory::kAdamV, Covers::kOptimizer},
    {"error_feedback", MemCategory::kOuterState, Covers::kOwn},
}};
inline const StateEntrySpec& state_entry_spec(StateEntry e) {
  return kStateEntrySpecs[static_cast<size_t>(e)];
}

// What decides a unit's layout, read from a run's options once (layout_plan).
struct LayoutPlan {
  StagePlan stage;  // the extents (full or own) of params, grads and the optimizer range
  Precision precision = Precision::kBF16;
  Offload offload = Offload::kNone;
  bool int8_moments = false;
  // The entries no option enables yet.
  bool muon = false;
  bool master_remainder = false;
  bool moments4 = false;
  bool error_feedback = false;
  // The units' partitions cut on multiples of this: kMomentBlock with quantized moments.
  uint64_t grain() const;
};
LayoutPlan layout_plan(const TrainConfig& c);
// The same over the engine's own stage plan (its policy decides the reductions; the extents
// are the same), which ShardedState keeps.
LayoutPlan layout_plan(const TrainConfig& c, const StagePlan& stage);
// The same from the positional view the planner's older entry points take.
LayoutPlan layout_plan(int stage, Precision precision, bool fp32_accumulator, Offload offload,
                       bool int8_moments);

// The offload file (train/offload.h) keeps each of a unit's states it holds in a region padded
// to whole blocks of this many bytes, so O_DIRECT can read any piece of it.
inline constexpr uint64_t kOffloadAlign = 4096;

// The offload file per element of a unit's optimizer range: the bytes of its in-file entries
// together (what one staged piece holds per element) and of the narrowest (a piece is whole
// kOffloadAlign blocks of each). The offload tier lays out the same entries (train/offload.h).
struct OffloadElement {
  uint64_t bytes = 0;
  uint64_t narrowest = 0;
};
// logic_error for a plan that puts nothing in the file, or an entry of less than a byte.
OffloadElement offload_element(const LayoutPlan& p);

// Rank `rank`'s range of Partition::aligned(numel, world, grain), in O(1): building the
// Partition costs O(world), which made every loop over ranks quadratic.
Range own_range(uint64_t numel, int world, int rank, uint64_t grain = 1);

// One entry's holding on a rank.
struct Holding {
  uint64_t count = 0;    // elements
  uint32_t bits = 0;     // per element
  bool in_file = false;  // a region of the offload file rather than memory
  uint64_t bytes() const { return (count * bits + 7) / 8; }
  // In the file: the region's bytes, padded to whole kOffloadAlign blocks.
  uint64_t file_bytes() const;
};

// A unit as the layout sees it: its elements, its tensors' element counts in order
// (Unit::tensors(); one tensor of `numel` for a model known only by its units' sizes), and
// which of them are matrices an optimizer of whole matrices takes (empty: none).
struct UnitShape {
  uint64_t numel = 0;
  std::span<const uint64_t> tensors = {};
  std::span<const uint8_t> matrix = {};
};

struct UnitLayout {
  Range own;        // the rank's range of the unit's partition
  Range params;     // what the params buffer holds: own, or the whole unit
  Range grads;      // what the grads buffer holds
  Range optimizer;  // what the optimizer updates (the master's and moments' range)
  std::array<Holding, kNumStateEntries> entries{};
  const Holding& operator[](StateEntry e) const { return entries[static_cast<size_t>(e)]; }
  Holding& operator[](StateEntry e) { return entries[static_cast<size_t>(e)]; }
};

// What rank `index` of the `shards` ranks a unit is partitioned over holds of it. O(tensors).
UnitLayout unit_layout(const LayoutPlan& p, const UnitShape& unit, int shards, int index);

// What all `shards` ranks hold of the unit together: one copy of each entry that covers the
// own range (the ranges add up to the unit; aligned partitions cut no block of quantized
// moments, so their blocks add up too), `shards` of each that covers the whole unit. In
// O(tensors), whatever the ranks. Sub-byte entries round once per copy, not per rank.
UnitLayout all_ranks_layout(const LayoutPlan& p, const UnitShape& unit, int shards);

// What rank `index` of the `shards` ranks a unit is partitioned over writes of it into a
// checkpoint shard (train/checkpoint_shards.h), in bytes: its own range of every state a
// checkpoint keeps, whatever extent the stage holds, as the layout of that range sizes them.
struct ShardUnitBytes {
  // The params, the fp32 master and Adam's moments (8-bit: a code per element, the block
  // scales and the small tensors' fp32 moments): in each shard of an island the rank hosts.
  uint64_t states = 0;
  // --islands, in island 0's shard: the outer weights and momentum, fp32 (`outer`), and with
  // --outer-delay the exchange in flight (`pending`), which the next step rewrites unwaited.
  uint64_t outer = 0;
  uint64_t pending = 0;
  ShardUnitBytes& operator+=(const ShardUnitBytes& o) {
    states += o.states;
    outer += o.outer;
    pending += o.pending;
    return *this;
  }
};
// O(tensors). logic_error for a state the layout holds that no checkpoint saves yet.
ShardUnitBytes checkpoint_shard_bytes(const LayoutPlan& p, const UnitShape& unit, int shards,
                                      int index, bool outer, bool pending);

// A layout's bytes: in memory by ledger category, and the offload file's.
struct LayoutBytes {
  MemoryLedger::Table memory{};
  uint64_t file = 0;
  LayoutBytes& operator+=(const UnitLayout& l);
  uint64_t operator[](MemCategory c) const { return memory[static_cast<size_t>(c)]; }
};

}  // namespace zerodp
