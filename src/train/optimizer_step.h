// The optimizer step over a rank's sharded state: what the rank's own gradient ranges say
// (their sum of squares, the first unit holding a non-finite value), and, once the ranks
// have agreed on those, the update: learning rate from the schedule, clipping, the fp16 loss
// scaler, AdamW on the optimizer range, the updated values rounded back into the 16-bit
// parameters and, when the stage plan says so, all-gathered into every rank's full copy.
// A step with a non-finite gradient or loss is skipped: no update, the scaler backs off.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/mutex.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/square_sum.h"
#include "train/config.h"
#include "train/held_islands.h"
#include "train/shard_group.h"
#include "train/sharded_state.h"
#include "train/state_store.h"

namespace zerodp {

// This rank's own gradient ranges, the same data at every stage.
struct OwnGradients {
  // Exact, so the ranks' partials merge to the same norm whatever the partition.
  SquareSum sum_squares;
  size_t first_bad_unit = 0;  // index + 1 of the first unit holding a non-finite value, 0 if none
};

// The counters a checkpoint carries.
struct OptimizerCounters {
  int64_t adam_step = 0;
  std::optional<LossScalerState> scaler;  // fp16 only
};

// What one step did, for the step's record.
struct UpdateOutcome {
  double lr = 0;
  double grad_norm = 0;          // of the averaged gradient, unscaled, before clipping
  double grad_norm_clipped = 0;  // after (the same as grad_norm when skipped)
  std::optional<double> loss_scale;
  bool skipped = false;
};

class OptimizerStep {
 public:
  // `chunk` is fp32 widening space the caller owns. `store`: where master, adam_m and
  // adam_v live (in `state`, or the offload file).
  OptimizerStep(const TrainConfig& cfg, ShardedState& state, ShardGroup& group,
                std::span<float> chunk, StateStore& store);

  // The scale the step's loss gradient is multiplied by: the fp16 loss scale, else 1.
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  OwnGradients inspect() const;
  // Given the ranks' summed squares and whether any rank saw a non-finite value, updates the
  // model (or skips the step) and advances the scaler. `sum_squares` has one entry per island
  // of `islands` (the states this optimizer's state and store show), each updated while the
  // iteration holds it active, with one AdamW counter and scaler for all (as islands on ranks
  // of their own keep them one); the outcome is island 0's.
  UpdateOutcome apply(int64_t step_index, std::span<const double> sum_squares, bool overflow,
                      HeldIslands& islands);
  // The learning rate of step `step_index` (1-based): what a checkpoint records as next.
  double lr_at(int64_t step_index) const { return schedule_.lr_at(step_index - 1); }

  // With --offload-overlap (stages 0 and 3), apply() returns with the update still
  // streaming on its own thread. wait_unit(i) returns once unit i's parameters are updated
  // (at once when no update runs); settle() once the update is done with every state and
  // buffer. Both rethrow the update's error. Everything but the next forward's reads of
  // updated parameters must settle first.
  void wait_unit(size_t i) EXCLUDES(mu_);
  void settle() EXCLUDES(mu_);
  // Whether wait_unit(i) would return without blocking.
  bool unit_ready(size_t i) EXCLUDES(mu_);

  OptimizerCounters counters() const;
  // Throws InvalidArgument when the scaler state is out of range.
  void restore(const OptimizerCounters& c);

  // Waits for an update still running (its error dropped: the caller is unwinding).
  ~OptimizerStep();
  OptimizerStep(const OptimizerStep&) = delete;
  OptimizerStep& operator=(const OptimizerStep&) = delete;

 private:
  void update(double lr, double coef);
  void stream_update(const AdamWConfig& ac, float coef, std::span<float> chunk, bool gathers);
  // AdamW on the store's piece of u's optimizer range (its master and moments; 8-bit moments'
  // scales, and their codes unless the piece holds them, from u's memory); then those
  // parameters rounded into the piece's (16-bit runs).
  void update_piece(UnitState& u, StateStore::Piece& p, const AdamWConfig& ac, float coef,
                    std::span<float> chunk);
  void gather(UnitState& u);

  const TrainConfig& cfg_;
  ShardedState& state_;
  ShardGroup& group_;
  std::span<float> chunk_;
  StateStore& store_;
  std::optional<LossScaler> scaler_;
  LrSchedule schedule_;
  int64_t adam_step_ = 0;
  std::vector<Work> works_;  // the gathers in flight; capacity kept
  // The overlapped update: its thread, its own widening chunk (the reducer uses chunk_ in
  // the backward), and how many units (in order) it has finished.
  std::thread updater_;
  std::vector<float> updater_chunk_;
  Mutex mu_;
  CondVar ready_cv_;
  size_t units_ready_ GUARDED_BY(mu_) = 0;
  bool updating_ GUARDED_BY(mu_) = false;
  std::exception_ptr update_error_ GUARDED_BY(mu_);
};

}  // namespace zerodp
