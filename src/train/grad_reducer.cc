// grad_reducer.h is the contract.
#include "train/grad_reducer.h"

#include <algorithm>
#include <cstring>

#include "train/flat.h"

namespace zerodp {

GradientReducer::GradientReducer(ShardedState& state, const TransientLayout& layout, int grad_accum,
                                 ShardGroup& group, MemoryLedger& ledger, std::span<float> chunk)
    : state_(state), plan_(state.plan()), grad_accum_(grad_accum), group_(group), chunk_(chunk) {
  const DType t = state.dtype();
  for (uint64_t n : layout.accum_full)
    accum_full_.emplace_back(ledger, MemCategory::kGradBuckets, t, n);
  for (uint64_t n : layout.accumulator)
    accumulators_.emplace_back(ledger, MemCategory::kGradAccum, n);
  for (int k = 0; k < layout.buckets; ++k) {
    buckets_.emplace_back(ledger, MemCategory::kGradBuckets, t, layout.bucket);
    if (layout.reduced > 0)
      reduced_.emplace_back(ledger, MemCategory::kCommBuffers, t, layout.reduced);
  }
}

void GradientReducer::begin_step() {
  for (auto& u : state_.units()) u.grads.zero();
  for (auto& f : accum_full_) f.zero();
  for (auto& a : accumulators_) std::fill(a.span().begin(), a.span().end(), 0.0f);
}

std::span<float> GradientReducer::accumulator(size_t ui) {
  if (!plan_.grads_fp32) return accumulators_[ui].span();
  UnitState& u = state_.units()[ui];
  return {static_cast<float*>(u.grads.data()), u.own.count()};
}

void GradientReducer::add(size_t ui, std::span<const float> dw) {
  UnitState& u = state_.units()[ui];
  const DType t = state_.dtype();
  if (plan_.micro_batch_reduce == StagePlan::Reduce::kNone) {
    Flat& target = plan_.accumulate_full ? accum_full_[ui] : u.grads;
    accumulate(dw, target.data(), t, 0);
    return;
  }
  // Round into a bucket, reduce it asynchronously, and add the result to the grads buffer
  // when it arrives. At most two buckets are in flight.
  if (pending_.size() == buckets_.size()) finish_pending(false);
  const int slot = next_bucket_;
  next_bucket_ = (next_bucket_ + 1) % static_cast<int>(buckets_.size());
  Flat& bucket = buckets_[slot];
  narrow(dw, bucket.data(), t, 0);
  Pending p{ui, Work(), slot};
  if (plan_.fp32_accumulator) {
    const std::span<float> acc = accumulator(ui);
    p.work = group_.reduce_scatter_async(bucket.range(0, u.numel), acc, u.part, ReduceOp::kSumInto);
  } else if (plan_.micro_batch_reduce == StagePlan::Reduce::kAllReduce) {
    p.work = group_.comm().all_reduce_async(bucket.range(0, u.numel), ReduceOp::kAvg);
  } else {
    p.work = group_.reduce_scatter_async(
        bucket.range(0, u.numel), reduced_[slot].range(0, u.own.count()), u.part, ReduceOp::kAvg);
  }
  pending_.push_back(std::move(p));
}

void GradientReducer::finish_pending(bool all) {
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    p.work.wait();
    UnitState& u = state_.units()[p.unit];
    if (plan_.fp32_accumulator) {
      pending_.pop_front();
      if (!all) break;
      continue;
    }
    // With one micro-batch per step the reduced gradient is the step's whole gradient and the
    // target was zeroed: copy it (adding it to zeros, widened and rounded back, gives the same
    // values at the cost of two more passes; only a zero's sign can differ, which no update
    // or norm sees).
    const auto add =
        grad_accum_ == 1 ? &GradientReducer::copy_reduced : &GradientReducer::add_widened;
    if (plan_.micro_batch_reduce == StagePlan::Reduce::kAllReduce) {
      (this->*add)(buckets_[p.slot].data(), u.numel, u.grads.data(), 0);
    } else {
      (this->*add)(reduced_[p.slot].data(), u.own.count(), u.grads.data(), u.grads_own);
    }
    pending_.pop_front();
    if (!all) break;
  }
}

// grads[first + i] = from[i] for i < count, both in the run's dtype.
void GradientReducer::copy_reduced(const void* from, size_t count, void* grads, size_t first) {
  const size_t size = dtype_size(state_.dtype());
  if (count) std::memcpy(static_cast<std::byte*>(grads) + first * size, from, count * size);
}

// grads[first + i] += from[i] for i < count, both in the run's dtype, through the fixed
// chunk: no allocation inside a step, and the same roundings as one whole pass.
void GradientReducer::add_widened(const void* from, size_t count, void* grads, size_t first) {
  const DType t = state_.dtype();
  if (t == DType::kF32) {
    accumulate(std::span<const float>(static_cast<const float*>(from), count), grads, t, first);
    return;
  }
  for (size_t b = 0; b < count; b += chunk_.size()) {
    const std::span<float> piece = chunk_.first(std::min(chunk_.size(), count - b));
    widen(from, t, b, piece);
    accumulate(piece, grads, t, first + b);
  }
}

// grads (own range) = round(acc / M), the one division and rounding of the canonical order;
// the divisor and operation are the averaging reduction's (comm/reduce.h), so A = 1 and
// A > 1 agree.
void GradientReducer::finish_accumulators() {
  const float m = static_cast<float>(grad_accum_) * static_cast<float>(group_.comm().size());
  std::vector<UnitState>& units = state_.units();
  works_.clear();
  for (size_t i = 0; i < units.size(); ++i) {
    UnitState& u = units[i];
    const std::span<float> acc = accumulator(i);
    for (float& x : acc) x /= m;
    if (plan_.grads_fp32) {
      // Rounded to the run's dtype and held widened, in place, chunk by chunk.
      for (size_t b = 0; state_.dtype() != DType::kF32 && b < acc.size(); b += chunk_.size()) {
        const std::span<float> piece = acc.subspan(b, std::min(chunk_.size(), acc.size() - b));
        narrow(piece, chunk_.data(), state_.dtype(), 0);
        widen(chunk_.data(), state_.dtype(), 0, piece);
      }
      continue;
    }
    narrow(acc, u.grads.data(), state_.dtype(), u.grads_own);
    if (plan_.gather_grads) {
      works_.push_back(group_.all_gather_async(u.grads.range(u.grads_own, u.own.count()),
                                               u.grads.buffer(), u.part));
    }
  }
  for (auto& w : works_) w.wait();
  works_.clear();
}

void GradientReducer::finish_step() {
  if (plan_.fp32_accumulator) {
    finish_accumulators();
    return;
  }
  if (plan_.boundary_reduce == StagePlan::Reduce::kNone) return;
  works_.clear();
  std::vector<UnitState>& units = state_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    UnitState& u = units[i];
    if (plan_.boundary_reduce == StagePlan::Reduce::kAllReduce) {
      works_.push_back(group_.comm().all_reduce_async(u.grads.buffer(), ReduceOp::kAvg));
    } else if (plan_.accumulate_full) {
      works_.push_back(group_.reduce_scatter_async(accum_full_[i].buffer(), u.grads.buffer(),
                                                   u.part, ReduceOp::kAvg));
    } else {
      // Full grads, own range reduced in place.
      works_.push_back(group_.reduce_scatter_async(
          u.grads.buffer(), u.grads.range(u.grads_own, u.own.count()), u.part, ReduceOp::kAvg));
    }
  }
  for (auto& w : works_) w.wait();
  works_.clear();
}

}  // namespace zerodp
