// The optimizer step over a rank's sharded state: what the rank's own gradient ranges say
// (their sum of squares, the first unit holding a non-finite value), and, once the ranks
// have agreed on those, the update: learning rate from the schedule, clipping, the fp16 loss
// scaler, AdamW on the optimizer range, the updated values rounded back into the 16-bit
// parameters and, when the stage plan says so, all-gathered into every rank's full copy.
// A step with a non-finite gradient or loss is skipped: no update, the scaler backs off.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "comm/communicator.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/square_sum.h"
#include "train/config.h"
#include "train/offload.h"
#include "train/shard_group.h"
#include "train/sharded_state.h"

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
  // `chunk` is fp32 widening space the caller owns. `offload`: where master, adam_m and
  // adam_v live when they are not in `state` (null: in memory).
  OptimizerStep(const TrainConfig& cfg, ShardedState& state, ShardGroup& group,
                std::span<float> chunk, OffloadTier* offload = nullptr);

  // The scale the step's loss gradient is multiplied by: the fp16 loss scale, else 1.
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  OwnGradients inspect() const;
  // Given the ranks' summed squares and whether any rank saw a non-finite value, updates the
  // model (or skips the step) and advances the scaler.
  UpdateOutcome apply(int64_t step_index, double sum_squares, bool overflow);
  // The learning rate of step `step_index` (1-based): what a checkpoint records as next.
  double lr_at(int64_t step_index) const { return schedule_.lr_at(step_index - 1); }

  OptimizerCounters counters() const;
  // Throws InvalidArgument when the scaler state is out of range.
  void restore(const OptimizerCounters& c);

 private:
  void update(double lr, double coef);
  // AdamW on elements [begin, begin + master.size()) of u's optimizer range, whose master and
  // moments are the spans given; then those parameters rounded into place.
  void update_range(UnitState& u, size_t begin, std::span<float> master, std::span<float> m,
                    std::span<float> v, const AdamWConfig& ac, float coef);
  void gather(UnitState& u);

  const TrainConfig& cfg_;
  ShardedState& state_;
  ShardGroup& group_;
  std::span<float> chunk_;
  OffloadTier* offload_;
  std::optional<LossScaler> scaler_;
  LrSchedule schedule_;
  int64_t adam_step_ = 0;
  std::vector<Work> works_;  // the gathers in flight; capacity kept
};

}  // namespace zerodp
