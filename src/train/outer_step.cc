// outer_step.h is the contract.
#include "train/outer_step.h"

#include <algorithm>

#include "train/flat.h"

namespace zerodp {

OuterStep::OuterStep(const TrainConfig& cfg, ShardedState& state, ShardGroup& island,
                     Communicator& column, MemoryLedger& ledger)
    : cfg_(cfg), state_(state), island_(island), column_(column), ledger_(ledger) {
  for (const UnitState& u : state_.units()) {
    global_.emplace_back(ledger_, MemCategory::kOuterState, u.own.count());
    momentum_.emplace_back(ledger_, MemCategory::kOuterState, u.own.count());
    owned_ += u.own.count();
  }
}

std::span<float> OuterStep::own_master(UnitState& u) {
  if (state_.fp32()) return {static_cast<float*>(u.params.data()) + u.params_own, u.own.count()};
  return u.master.span().subspan(u.opt_own, u.own.count());
}

void OuterStep::begin() {
  for (size_t i = 0; i < state_.units().size(); ++i) {
    const std::span<const float> master = own_master(state_.units()[i]);
    std::copy(master.begin(), master.end(), global_[i].data());
  }
}

void OuterStep::apply() {
  std::vector<UnitState>& units = state_.units();
  // The pseudo-gradients of every unit, each all-reduced as soon as it is computed.
  Buffer<float> delta(ledger_, MemCategory::kCommBuffers, owned_);
  std::vector<Work> works;
  size_t at = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const std::span<const float> master = own_master(units[i]);
    const std::span<float> d = delta.span().subspan(at, master.size());
    const float* g = global_[i].data();
    for (size_t e = 0; e < d.size(); ++e) d[e] = g[e] - master[e];
    works.push_back(column_.all_reduce_async(d, ReduceOp::kAvg));
    at += d.size();
  }
  const float mu = cfg_.outer_momentum;
  const float lr = cfg_.outer_lr;
  std::vector<Work> gathers;
  at = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    UnitState& u = units[i];
    works[i].wait();
    const std::span<float> master = own_master(u);
    const float* avg = delta.data() + at;
    float* g = global_[i].data();
    float* m = momentum_[i].data();
    for (size_t e = 0; e < master.size(); ++e) {
      m[e] = mu * m[e] + avg[e];
      g[e] = g[e] - lr * (avg[e] + mu * m[e]);
      master[e] = g[e];
    }
    at += master.size();
    if (!state_.fp32()) narrow(master, u.params.data(), state_.dtype(), u.params_own);
    // The island's other copies: the params each rank holds whole (stages 0-2), and the
    // master at stage 0 (at fp32 the params are the master).
    if (u.held.count() != u.own.count()) {
      gathers.push_back(island_.all_gather_async(u.params.range(u.params_own, u.own.count()),
                                                 u.params.buffer(), u.part));
    }
    if (!state_.fp32() && u.opt_range.count() != u.own.count()) {
      gathers.push_back(island_.all_gather_async(master, u.master.span(), u.part));
    }
  }
  for (Work& w : gathers) w.wait();
  ++outer_steps_;
}

}  // namespace zerodp
