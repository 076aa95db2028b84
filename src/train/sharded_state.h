// A rank's model states: for every unit of the model, the buffers the stage plan says this
// rank holds, allocated on its memory ledger and initialized from the pure init function.
//
// Per unit (Φ_u elements, own range c_u of its partition):
//   params  the run's dtype (bf16, fp16; fp32 at --precision fp32)   Φ_u, or c_u at stage 3
//   grads   the same dtype (fp32 when it is the canonical order's     Φ_u, or c_u at stages 2-3
//           accumulator, StagePlan::grads_fp32)
//   master  fp32 (none at fp32: the params are the master)            Φ_u, or c_u at stages 1-3
//   adam_m, adam_v  fp32                                              as master
//                   --optimizer-states int8 (optim/moments8.h): tensors of kMomentMinNumel
//                   elements or more as one byte each plus an fp32 scale per block, the rest
//                   fp32; the partition is then cut on the block grid (Partition::aligned)
// The counts are the unit's state layout (train/state_layout.h), which the planner sums.
// Every offset the step needs ("where does my own range start in this buffer") is computed
// here once, when the buffers are allocated, and read from UnitState.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "core/partition.h"
#include "memory/ledger.h"
#include "models/unit.h"
#include "optim/moments8.h"
#include "tensor/dtype.h"
#include "train/config.h"
#include "train/stage_plan.h"
#include "train/state_layout.h"

namespace zerodp {

DType param_dtype(Precision p);

// A byte buffer of `count` elements of a dtype known at run time, charged to one ledger
// category.
struct Flat {
  Buffer<std::byte> bytes;
  DType dtype = DType::kF32;
  size_t count = 0;
  Flat() = default;
  Flat(MemoryLedger& ledger, MemCategory c, DType t, size_t n)
      : bytes(ledger, c, n * dtype_size(t)), dtype(t), count(n) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  void* at(size_t i) { return bytes.data() + i * dtype_size(dtype); }
  const void* at(size_t i) const { return bytes.data() + i * dtype_size(dtype); }
  MutableBuffer buffer() { return {bytes.data(), count, dtype}; }
  MutableBuffer range(size_t first, size_t n) { return {at(first), n, dtype}; }
  void zero() {
    if (count) std::memset(bytes.data(), 0, bytes.size());
  }
};

// One tensor's part of the optimizer range: its weight decay, and where its moments live.
struct DecaySegment {
  size_t begin = 0;  // relative to the optimizer range
  size_t end = 0;
  bool decay = true;
  // fp32 moments: from element `at` of adam_m / adam_v. Quantized: codes from element `at`
  // of m_codes / v_codes, scales from `block_at` of m_scales / v_scales, the first block
  // `first` elements long (the rest of its grid cell).
  bool quantized = false;
  size_t at = 0;
  size_t block_at = 0;
  size_t first = 0;
  // Quantized: the index, among the segment's blocks, of the one starting at `b` (the
  // segment's start or a grid line), and the blocks of [b, e).
  size_t block_index(size_t b) const {
    return b == begin ? 0 : 1 + (b - begin - first) / kMomentBlock;
  }
  size_t block_count(size_t b, size_t e) const {
    return moment_blocks(e - b, b == begin ? first : kMomentBlock);
  }
};

struct UnitState {
  Unit* unit = nullptr;
  size_t numel = 0;
  Partition part;
  Range own;        // this rank's range of the unit's flat buffer
  Range held;       // what `params` holds: own, or all of the unit
  Range opt_range;  // what this rank's optimizer updates: own, or all of the unit
  // What the buffers below were sized from, and what the offload tier lays its file out by.
  UnitLayout layout;
  Flat params;  // the held range; empty when the offload tier holds it
  Flat grads;   // all of the unit, or the own range
  // The optimizer range; empty at fp32, which updates `params`, and under offload.
  Buffer<float> master;
  // Empty under offload; with int8 moments the fp32 tensors' only (offloaded too).
  Buffer<float> adam_m;
  Buffer<float> adam_v;
  Buffer<uint8_t> m_codes, v_codes;  // int8 moments (charged to adam_m / adam_v); not offloaded
  Buffer<float> m_scales, v_scales;  // int8 moments' block scales, offloaded or not
  // Where ranges start inside the buffers (element offsets).
  size_t params_own = 0;  // own range in params
  size_t params_opt = 0;  // optimizer range in params (the fp32 master)
  size_t grads_own = 0;   // own range in grads
  size_t grads_opt = 0;   // optimizer range in grads
  size_t opt_own = 0;     // own range in master / adam_m / adam_v
  std::vector<DecaySegment> decay;
  // What the forward widens to fp32: the whole buffer, or under bf16 products only the
  // tensors read other than as product operands (TensorUse), adjacent ones merged.
  std::vector<Range> widen;

  // The fp32 values the optimizer updates: master, or the params themselves at fp32.
  std::span<float> master_values();
  std::span<const float> master_values() const;
  // The 8-bit moments of elements [b, b + len) of quantized segment `s` (b its start or on
  // the grid): the block scales, and the codes from the unit's own m_codes / v_codes or, given
  // the offload file's piece (`m8`/`v8`, the optimizer range's codes from `piece_begin`), from
  // that.
  QuantizedMoments quantized(const DecaySegment& s, size_t b, size_t len,
                             std::span<uint8_t> m8 = {}, std::span<uint8_t> v8 = {},
                             size_t piece_begin = 0);
};

// Zero moments' codes of elements [begin, begin + m.size()) of u's optimizer range, as the
// offload file holds them: the code of 0 in quantized tensors, 0 in the others.
void fill_codes_of_zero(const UnitState& u, size_t begin, std::span<uint8_t> m,
                        std::span<uint8_t> v);

class ShardedState {
 public:
  // Allocates and initializes rank `rank`'s states for `model` (which must outlive this),
  // as `plan` says, on `ledger`. `products_read_bf16`: the forward's products read 16-bit
  // weights from their stored copy, so product operands need no widening.
  // `offload`: master, adam_m and adam_v (with kParams also the parameter shards) are left
  // unallocated: the OffloadTier holds them.
  // `int8_moments`: --optimizer-states int8.
  ShardedState(const Model& model, const StagePlan& plan, Precision precision,
               bool products_read_bf16, bool decay_all, uint64_t seed, int world, int rank,
               MemoryLedger& ledger, Offload offload = Offload::kNone, bool int8_moments = false);
  // The same from the run's layout plan (train/state_layout.h; layout.stage is the plan the
  // step reads): every buffer is sized by unit_layout, the planner's own table.
  ShardedState(const Model& model, const LayoutPlan& layout, bool products_read_bf16,
               bool decay_all, uint64_t seed, int world, int rank, MemoryLedger& ledger);

  std::vector<UnitState>& units() { return units_; }
  const std::vector<UnitState>& units() const { return units_; }
  const StagePlan& plan() const { return plan_; }
  DType dtype() const { return dtype_; }
  bool fp32() const { return dtype_ == DType::kF32; }
  size_t max_numel() const { return max_numel_; }
  bool int8_moments() const { return int8_moments_; }
  uint64_t params() const;

 private:
  StagePlan plan_;
  DType dtype_;
  size_t max_numel_ = 0;
  bool int8_moments_ = false;
  std::vector<UnitState> units_;
};

}  // namespace zerodp
