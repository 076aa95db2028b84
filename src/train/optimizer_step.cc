// optimizer_step.h is the contract.
#include "train/optimizer_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/moments8.h"
#include "train/flat.h"

namespace zerodp {
namespace {

LrSchedule make_schedule(const TrainConfig& cfg) {
  LrScheduleConfig lc;
  lc.kind = parse_lr_schedule(cfg.schedule);
  lc.max_lr = cfg.lr;
  lc.warmup_steps = cfg.warmup;
  // --steps 0 evaluates no step of it: any valid schedule does.
  lc.total_steps = cfg.steps > 0 ? cfg.steps : cfg.warmup + 1;
  lc.min_lr = cfg.lr * cfg.min_lr_ratio;
  return LrSchedule(lc);
}

}  // namespace

OptimizerStep::OptimizerStep(const TrainConfig& cfg, ShardedState& state, ShardGroup& group,
                             std::span<float> chunk, StateStore& store)
    : cfg_(cfg),
      state_(state),
      group_(group),
      chunk_(chunk),
      store_(store),
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

UpdateOutcome OptimizerStep::apply(int64_t step_index, std::span<const double> sum_squares,
                                   bool overflow, HeldIslands& islands) {
  const double scale = loss_scale();
  if (!overflow) ++adam_step_;
  UpdateOutcome first;
  islands.for_each([&](int island) {
    const auto v = static_cast<size_t>(island);
    UpdateOutcome out;
    out.loss_scale = scaler_ ? std::optional<double>(scale) : std::nullopt;
    out.grad_norm = std::sqrt(sum_squares[v]) / scale;
    const double coef = cfg_.clip > 0 ? clip_coefficient(out.grad_norm, cfg_.clip) : 1.0;
    out.grad_norm_clipped = out.grad_norm * coef;
    out.lr = lr_at(step_index);
    if (overflow) {
      out.skipped = true;
      out.grad_norm_clipped = out.grad_norm;
    } else {
      update(out.lr, coef / scale);
    }
    if (v == 0) first = out;
  });
  if (scaler_) (void)scaler_->update(overflow);
  return first;
}

// AdamW on the optimizer range; then the updated parameters are rounded into place and,
// when the plan says so, all-gathered. Offloaded, the same ranges arrive piece by piece
// (AdamW is elementwise, so any split gives the same bits) and each unit's gather is issued
// after its last piece, in unit order as in memory; with the overlap on (stages 0 and 3,
// which gather nothing after the update) the stream runs on the updater thread.
void OptimizerStep::update(double lr, double coef) {
  AdamWConfig ac;
  ac.lr = lr;
  ac.weight_decay = cfg_.weight_decay;
  works_.clear();
  const float c = static_cast<float>(coef);
  // The overlap is --offload's (resolve_config refuses it otherwise): the update waits on
  // the file's I/O, which the next forward's compute can hide.
  if (cfg_.offload != Offload::kNone && cfg_.offload_overlap &&
      !state_.plan().gather_after_update) {
    settle();
    updater_chunk_.resize(chunk_.size());
    {
      MutexLock lock(mu_);
      units_ready_ = 0;
      updating_ = true;
    }
    updater_ = std::thread([this, ac, c] {
      std::exception_ptr error;
      try {
        stream_update(ac, c, updater_chunk_, false);
      } catch (...) {
        error = std::current_exception();
      }
      MutexLock lock(mu_);
      update_error_ = error;
      updating_ = false;
      ready_cv_.notify_all();
    });
  } else {
    stream_update(ac, c, chunk_, true);
  }
  for (auto& w : works_) w.wait();
  works_.clear();
}

void OptimizerStep::stream_update(const AdamWConfig& ac, float coef, std::span<float> chunk,
                                  bool gathers) {
  std::vector<UnitState>& units = state_.units();
  // 16-bit parameters are rounded from the master, never read (at fp32 they are the master).
  const unsigned unread = state_.fp32() ? 0u : StateStore::kParams;
  const unsigned arrays = StateStore::kAll | StateStore::kParams;
  std::vector<StateStore::Job> jobs;
  for (size_t i = 0; i < units.size(); ++i) {
    jobs.push_back({i, {0, units[i].opt_range.count()}, arrays, unread});
  }
  size_t done = 0;  // units whose update (and gather) is finished
  const auto finished = [&](size_t upto) {
    for (; done < upto; ++done) {
      if (gathers) gather(units[done]);
    }
    MutexLock lock(mu_);
    units_ready_ = done;
    ready_cv_.notify_all();
  };
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t before = store_.bytes_moved();
  store_.stream(jobs, StateStore::Access::kReadWrite, [&](StateStore::Piece& p) {
    update_piece(units[p.unit], p, ac, coef, chunk);
    if (p.last) finished(p.unit + 1);
  });
  finished(units.size());
  store_.count_update(store_.bytes_moved() - before,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

bool OptimizerStep::unit_ready(size_t i) {
  MutexLock lock(mu_);
  return !updating_ || units_ready_ > i;
}

void OptimizerStep::wait_unit(size_t i) {
  if (!updater_.joinable()) return;
  bool failed = false;
  {
    MutexLock lock(mu_);
    while (updating_ && units_ready_ <= i) ready_cv_.wait(mu_);
    failed = update_error_ != nullptr;
  }
  if (failed) settle();
}

void OptimizerStep::settle() {
  if (!updater_.joinable()) return;
  updater_.join();
  std::exception_ptr error;
  {
    MutexLock lock(mu_);
    std::swap(error, update_error_);
  }
  if (error) std::rethrow_exception(error);
}

OptimizerStep::~OptimizerStep() {
  if (updater_.joinable()) updater_.join();
}

void OptimizerStep::update_piece(UnitState& u, StateStore::Piece& p, const AdamWConfig& ac,
                                 float coef, std::span<float> chunk) {
  const std::span<float> master = p.master;
  const size_t begin = p.begin, end = begin + master.size();
  const bool int8 = state_.int8_moments();
  for (const DecaySegment& s : u.decay) {
    const size_t lo = std::max(s.begin, begin), hi = std::min(s.end, end);
    // AdamW is elementwise: chunk by chunk (widening the gradient into the chunk unless it is
    // fp32 already) gives the same bits as one pass; with 8-bit moments, blockwise, so a
    // chunk ends on the unit's block grid.
    for (size_t b = lo, len = 0; b < hi; b += len) {
      len = std::min(chunk.size(), hi - b);
      if (s.quantized && b + len < hi) len -= (u.opt_range.begin + b + len) % kMomentBlock;
      std::span<const float> grad;
      if (u.grads.dtype == DType::kF32) {
        grad = std::span<const float>(static_cast<const float*>(u.grads.data()) + u.grads_opt + b,
                                      len);
      } else {
        const std::span<float> piece = chunk.first(len);
        widen(u.grads.data(), u.grads.dtype, u.grads_opt + b, piece);
        grad = piece;
      }
      if (s.quantized) {
        adamw8_update(master.subspan(b - begin, len), grad,
                      u.quantized(s, b, len, p.m8, p.v8, p.begin), s.decay, ac, adam_step_, coef);
        continue;
      }
      // 8-bit runs keep the fp32 tensors' moments apart, segment after segment.
      const size_t at = int8 ? s.at + (b - s.begin) : b - begin;
      const AdamWShard shard{.master = master.subspan(b - begin, len),
                             .m = (int8 ? u.adam_m.span() : p.m).subspan(at, len),
                             .v = (int8 ? u.adam_v.span() : p.v).subspan(at, len),
                             .grad = grad,
                             .offset = u.opt_range.begin + b};
      adamw_update(shard, s.decay, ac, adam_step_, coef);
    }
  }
  if (!state_.fp32()) narrow(master, p.params, state_.dtype(), 0);
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
