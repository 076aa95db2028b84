// The gradient reducer: where each unit's micro-batch gradient goes, and how the ranks'
// gradients become the averaged gradient each rank's optimizer reads. The seam for other
// reduction orders and quantized collectives.
//
// Under --accumulate reduce every micro-batch's gradient is rounded into a bucket as the
// backward produces it and reduced asynchronously (the stage plan says all-reduce or
// reduce-scatter), at most two buckets in flight; each result is added to the grads buffer
// when it arrives. Under --accumulate local the micro-batches are summed on the rank (into
// grads, or a full-size sum when grads holds only the own range) and reduced once at the
// step's boundary. Either way, after finish_step() the grads buffer holds the averaged
// gradient of every range the rank's optimizer reads, summed in a fixed order.
//
// The canonical order (docs/determinism.md) with A > 1 micro-batches per step: each
// micro-batch's gradient (seeded with the loss scale alone, not divided by A) is rounded
// once into a bucket and reduce-scattered into the owner's fp32 accumulator, which adds the
// N ranks' contributions in rank order: micro-batch i = k * N + r is added i-th, for every
// N. The boundary divides by M = A * N once and rounds once into the grads buffer; stage 0
// then all-gathers it. At stages 2-3 the grads buffer, which holds only the own range, is
// the accumulator itself (StagePlan::grads_fp32): the rounded average stays in it, widened.
// With A = 1 that is what the averaging reduction computes already.
#pragma once

#include <cstddef>
#include <deque>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "train/plan.h"
#include "train/shard_group.h"
#include "train/sharded_state.h"

namespace zerodp {

class GradientReducer {
 public:
  // Allocates the layout's buckets, reduced shards and full-size sums on `ledger`. `chunk`
  // is fp32 widening space the caller owns (no allocation inside a step). `grad_accum`: the
  // micro-batches per step.
  GradientReducer(ShardedState& state, const TransientLayout& layout, int grad_accum,
                  ShardGroup& group, MemoryLedger& ledger, std::span<float> chunk);

  // Zeroes what the step's gradients accumulate into.
  void begin_step();
  // Unit `ui`'s gradient of one micro-batch (fp32, scaled by the loss scale and, outside
  // the canonical order, by 1/A).
  void add(size_t ui, std::span<const float> dw);
  // The micro-batch's backward is done: every reduction it started has landed.
  void finish_micro_batch() { finish_pending(true); }
  // The step's last micro-batch is done: --accumulate local's one reduction.
  void finish_step();

 private:
  struct Pending {
    size_t unit = 0;
    Work work;
    int slot = 0;
  };
  void finish_pending(bool all);
  void add_widened(const void* from, size_t count, void* grads, size_t first);
  void copy_reduced(const void* from, size_t count, void* grads, size_t first);
  void finish_accumulators();
  // Unit `ui`'s fp32 accumulator: its own, or the grads buffer itself (grads_fp32).
  std::span<float> accumulator(size_t ui);

  ShardedState& state_;
  const StagePlan& plan_;
  int grad_accum_;
  ShardGroup& group_;
  std::span<float> chunk_;
  std::vector<Flat> accum_full_;  // per unit, when the plan accumulates full-size sums
  std::vector<Flat> buckets_;
  std::vector<Flat> reduced_;
  std::vector<Buffer<float>> accumulators_;  // per unit, the own range (canonical, A > 1)
  std::deque<Pending> pending_;
  int next_bucket_ = 0;
  std::vector<Work> works_;  // the boundary's collectives in flight; capacity kept
};

}  // namespace zerodp
