// The ZeRO stage as what the step loop does: the table of docs/zero.md as code. Every
// question the engine and the planner ask of a stage ("does this buffer hold the whole unit
// or my range?", "how is a micro-batch's gradient reduced?", "when are parameters
// gathered?") is answered here, from the three Sharding switches and the accumulation
// policy; nothing else reads the switches.
//
//   stage  params  grads  optimizer  micro-batch reduce    boundary reduce        gathers
//   0      full    full   full       all-reduce            all-reduce             none
//   1      full    full   own        reduce-scatter        reduce-scatter (own)   after update
//   2      full    own    own        reduce-scatter        from the full sum      after update
//   3      own     own    own        reduce-scatter        from the full sum      before compute
//
// The micro-batch column applies under --accumulate reduce (every micro-batch reduced as
// its backward produces it), the boundary column under --accumulate local (micro-batches
// summed on the rank, one reduction per step).
//
// The canonical order with more than one micro-batch per step (docs/determinism.md) reduces
// every micro-batch at every stage by a reduce-scatter that adds into the owner's fp32
// accumulator; the owner divides once at the boundary, and stage 0, whose ranks all update
// the whole model, then all-gathers the averaged gradient.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/partition.h"
#include "train/config.h"

namespace zerodp {

struct StagePlan {
  // What a per-unit buffer holds: the whole unit, or the rank's own partition range.
  enum class Extent : uint8_t { kFull, kOwn };
  enum class Reduce : uint8_t {
    kNone,
    kAllReduce,      // every rank ends with the whole averaged gradient
    kReduceScatter,  // every rank ends with its own range of it
  };

  int stage = 0;
  AccumulatePolicy policy = AccumulatePolicy::kReduce;
  Extent params = Extent::kFull;
  Extent grads = Extent::kFull;
  Extent optimizer = Extent::kFull;  // fp32 master and Adam moments
  // --accumulate reduce: how each micro-batch's gradient is reduced as backward produces it
  // (through a bucket); kNone under --accumulate local.
  Reduce micro_batch_reduce = Reduce::kNone;
  // --accumulate local: the one reduction at the step's boundary; kNone under reduce.
  Reduce boundary_reduce = Reduce::kNone;
  // --accumulate local with sharded gradients: micro-batches are summed into a full-size
  // buffer, since the grads buffer holds only the own range the reduction will write.
  bool accumulate_full = false;
  // Stage 3: a unit's parameters are all-gathered before its forward and its backward.
  bool gather_before_compute = false;
  // Stages 1-2: after the update, each rank's own range is all-gathered into the full
  // parameters every rank keeps.
  bool gather_after_update = false;
  // The canonical order over several micro-batches: reductions add into an fp32 accumulator
  // of the own range, and the boundary divides it into the grads buffer.
  bool fp32_accumulator = false;
  // Stage 0 under fp32_accumulator: the boundary all-gathers the averaged gradient.
  bool gather_grads = false;
  // Stages 2-3 under fp32_accumulator: the grads buffer, which holds only the own range,
  // is the accumulator, in fp32; the boundary leaves the average in it, rounded to the
  // run's dtype and held widened (the values the 16-bit buffer would hold).
  bool grads_fp32 = false;

  // `fp32_accumulator`: the canonical order with more than one micro-batch per step (only
  // under kReduce).
  static StagePlan make(int stage, AccumulatePolicy policy, bool fp32_accumulator = false);

  // The range of the unit a buffer of `extent` holds.
  static Range held(Extent extent, Range own, size_t numel) {
    return extent == Extent::kOwn ? own : Range{0, numel};
  }
  // Where element `first` of the unit sits in a buffer of `extent`, given that the buffer
  // holds it (at 0 in a buffer holding the own range that starts there).
  static size_t offset(Extent extent, Range own, size_t first) {
    return extent == Extent::kOwn ? first - own.begin : first;
  }
  static size_t count(Extent extent, size_t own, size_t numel) {
    return extent == Extent::kOwn ? own : numel;
  }
};

}  // namespace zerodp
