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
                             std::span<float> chunk, OffloadTier* offload)
    : cfg_(cfg),
      state_(state),
      group_(group),
      chunk_(chunk),
      offload_(offload),
      schedule_(make_schedule(cfg)) {
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
// when the plan says so, all-gathered. Offloaded, the same ranges arrive piece by piece
// (AdamW is elementwise, so any split gives the same bits) and each unit's gather is issued
// after its last piece, in unit order as in memory.
void OptimizerStep::update(double lr, double coef) {
  AdamWConfig ac;
  ac.lr = lr;
  ac.weight_decay = cfg_.weight_decay;
  works_.clear();
  std::vector<UnitState>& units = state_.units();
  const float c = static_cast<float>(coef);
  if (offload_ == nullptr) {
    for (auto& u : units) {
      if (u.opt_range.count() > 0) {
        update_range(u, 0, u.master_values(), u.adam_m.span(), u.adam_v.span(), ac, c);
      }
      gather(u);
    }
  } else {
    std::vector<OffloadTier::Job> jobs;
    for (size_t i = 0; i < units.size(); ++i) {
      jobs.push_back({i, {0, units[i].opt_range.count()}, OffloadTier::kAll});
    }
    size_t gathered = 0;  // units whose gather is issued
    offload_->stream(jobs, OffloadTier::Access::kReadWrite, [&](OffloadTier::Piece& p) {
      update_range(units[p.unit], p.begin, p.master, p.m, p.v, ac, c);
      if (p.last) {
        for (; gathered <= p.unit; ++gathered) gather(units[gathered]);
      }
    });
    for (; gathered < units.size(); ++gathered) gather(units[gathered]);
  }
  for (auto& w : works_) w.wait();
  works_.clear();
}

void OptimizerStep::update_range(UnitState& u, size_t begin, std::span<float> master,
                                 std::span<float> m, std::span<float> v, const AdamWConfig& ac,
                                 float coef) {
  const size_t end = begin + master.size();
  for (const DecaySegment& s : u.decay) {
    const size_t lo = std::max(s.begin, begin), hi = std::min(s.end, end);
    // AdamW is elementwise: chunk by chunk (widening the gradient into the chunk unless it is
    // fp32 already) gives the same bits as one pass.
    for (size_t b = lo; b < hi; b += chunk_.size()) {
      const size_t len = std::min(chunk_.size(), hi - b);
      std::span<const float> grad;
      if (u.grads.dtype == DType::kF32) {
        grad = std::span<const float>(static_cast<const float*>(u.grads.data()) + u.grads_opt + b,
                                      len);
      } else {
        const std::span<float> piece = chunk_.first(len);
        widen(u.grads.data(), u.grads.dtype, u.grads_opt + b, piece);
        grad = piece;
      }
      const AdamWShard shard{.master = master.subspan(b - begin, len),
                             .m = m.subspan(b - begin, len),
                             .v = v.subspan(b - begin, len),
                             .grad = grad,
                             .offset = u.opt_range.begin + b};
      adamw_update(shard, s.decay, ac, adam_step_, coef);
    }
  }
  if (!state_.fp32()) narrow(master, u.params.data(), state_.dtype(), u.params_opt + begin);
}

void OptimizerStep::gather(UnitState& u) {
  if (state_.plan().gather_after_update) {
    works_.push_back(group_.all_gather_async(u.params.range(u.params_own, u.own.count()),
                                             u.params.buffer(), u.part));
  }
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
