// optimizer_step.h is the contract.
#include "train/optimizer_step.h"

#include <algorithm>
#include <cmath>

#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "train/flat.h"

namespace zerodp {
namespace {

LrSchedule make_schedule(const TrainConfig& cfg) {
  LrScheduleConfig lc;
  lc.kind = parse_lr_schedule(cfg.schedule);
  lc.max_lr = cfg.lr;
  lc.warmup_steps = cfg.warmup;
  lc.total_steps = cfg.steps;
  lc.min_lr = cfg.lr * cfg.min_lr_ratio;
  return LrSchedule(lc);
}

}  // namespace

OptimizerStep::OptimizerStep(const TrainConfig& cfg, ShardedState& state, ShardGroup& group,
                             std::span<float> chunk)
    : cfg_(cfg), state_(state), group_(group), chunk_(chunk), schedule_(make_schedule(cfg)) {
  if (cfg.precision == Precision::kFP16) {
    LossScalerConfig sc;
    sc.initial_scale = cfg.initial_loss_scale;
    scaler_.emplace(sc);
  }
}

OwnGradients OptimizerStep::inspect() const {
  OwnGradients g;
  const std::vector<UnitState>& units = state_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    const UnitState& u = units[i];
    if (g.first_bad_unit == 0 &&
        !all_finite(u.grads.data(), u.grads.dtype, u.grads_own, u.own.count())) {
      g.first_bad_unit = i + 1;
    }
    g.sum_squares.add(u.grads.data(), u.grads.dtype, u.grads_own, u.own.count());
  }
  return g;
}

UpdateOutcome OptimizerStep::apply(int64_t step_index, double sum_squares, bool overflow) {
  const double scale = loss_scale();
  UpdateOutcome out;
  out.loss_scale = scaler_ ? std::optional<double>(scale) : std::nullopt;
  out.grad_norm = std::sqrt(sum_squares) / scale;
  const double coef = cfg_.clip > 0 ? clip_coefficient(out.grad_norm, cfg_.clip) : 1.0;
  out.grad_norm_clipped = out.grad_norm * coef;
  out.lr = lr_at(step_index);
  if (overflow) {
    out.skipped = true;
    out.grad_norm_clipped = out.grad_norm;
  } else {
    ++adam_step_;
    update(out.lr, coef / scale);
  }
  if (scaler_) (void)scaler_->update(overflow);
  return out;
}

// AdamW on the optimizer range; then the updated parameters are rounded into place and,
// when the plan says so, all-gathered.
void OptimizerStep::update(double lr, double coef) {
  const DType t = state_.dtype();
  const bool fp32 = state_.fp32();
  AdamWConfig ac;
  ac.lr = lr;
  ac.weight_decay = cfg_.weight_decay;
  works_.clear();
  for (auto& u : state_.units()) {
    const size_t n = u.opt_range.count();
    if (n > 0) {
      const std::span<float> master = u.master_values();
      // AdamW is elementwise: chunk by chunk (widening the gradient into the chunk unless it
      // is fp32 already) gives the same bits as one pass.
      for (const DecaySegment& s : u.decay) {
        for (size_t b = s.begin; b < s.end; b += chunk_.size()) {
          const size_t len = std::min(chunk_.size(), s.end - b);
          std::span<const float> grad;
          if (u.grads.dtype == DType::kF32) {
            grad = std::span<const float>(
                static_cast<const float*>(u.grads.data()) + u.grads_opt + b, len);
          } else {
            const std::span<float> piece = chunk_.first(len);
            widen(u.grads.data(), u.grads.dtype, u.grads_opt + b, piece);
            grad = piece;
          }
          const AdamWShard shard{.master = master.subspan(b, len),
                                 .m = u.adam_m.span().subspan(b, len),
                                 .v = u.adam_v.span().subspan(b, len),
                                 .grad = grad,
                                 .offset = u.opt_range.begin + b};
          adamw_update(shard, s.decay, ac, adam_step_, static_cast<float>(coef));
        }
      }
      if (!fp32) narrow(master, u.params.data(), t, u.params_opt);
    }
    if (state_.plan().gather_after_update) {
      works_.push_back(group_.all_gather_async(u.params.range(u.params_own, u.own.count()),
                                               u.params.buffer(), u.part));
    }
  }
  for (auto& w : works_) w.wait();
  works_.clear();
}

OptimizerCounters OptimizerStep::counters() const {
  OptimizerCounters c;
  c.adam_step = adam_step_;
  if (scaler_) c.scaler = scaler_->state();
  return c;
}

void OptimizerStep::restore(const OptimizerCounters& c) {
  adam_step_ = c.adam_step;
  if (scaler_) {
    LossScalerState st;
    if (c.scaler) {
      st = *c.scaler;
    } else {
      st.scale = cfg_.initial_loss_scale;  // from bf16/fp32: a fresh scaler
    }
    scaler_.emplace(scaler_->config(), st);
  }
}

}  // namespace zerodp
