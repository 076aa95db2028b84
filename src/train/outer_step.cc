// outer_step.h is the contract.
#include "train/outer_step.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "comm/quantize.h"
#include "train/flat.h"

namespace zerodp {

std::vector<int> fragments_ending(const TrainConfig& cfg, int64_t step) {
  std::vector<int> out;
  if (cfg.islands == 1 || step < 1) return out;
  const int64_t h = cfg.outer_every;
  const int f_count = cfg.fragments;
  for (int f = 0; f < f_count; ++f) {
    if (step == cfg.steps || step % h == f * h / f_count % h) out.push_back(f);
  }
  return out;
}

Range fragment_range(uint64_t total, int fragments, int f) {
  return balanced_range(total, fragments, f);
}

QuantBits OuterStep::quant_bits() const {
  return cfg_.outer_quant == 4 ? QuantBits::kInt4 : QuantBits::kInt8;
}

template <typename Fn>
void OuterStep::for_each_block_run(int f, Fn&& fn) const {
  size_t k = 0;
  bool first = true;
  uint64_t last = 0;
  for (const Piece& p : fragments_[static_cast<size_t>(f)]) {
    for (size_t e = 0; e < p.count;) {
      const uint64_t block = (p.rel + e) / kOuterQuantBlock;
      const size_t n = static_cast<size_t>(
          std::min<uint64_t>(p.count - e, (block + 1) * kOuterQuantBlock - (p.rel + e)));
      if (!first && block != last) ++k;
      first = false;
      last = block;
      fn(p.buffer_at + e, n, block, k);
      e += n;
    }
  }
}

OuterStep::OuterStep(const TrainConfig& cfg, ShardedState& state, StateStore& store,
                     ShardGroup& island, Communicator& column, MemoryLedger& ledger,
                     HeldIslands& held)
    : cfg_(cfg), state_(state), store_(store), island_(island), column_(column), held_(held) {
  uint64_t total = 0;
  for (const UnitState& u : state_.units()) total += u.numel;
  check_fragments(cfg, total);
  fragments_.resize(static_cast<size_t>(cfg.fragments));
  touched_.resize(static_cast<size_t>(cfg.fragments));
  for (int f = 0; f < cfg.fragments; ++f) {
    const Range fr = fragment_range(total, cfg.fragments, f);
    uint64_t unit_at = 0;  // the unit's first element in the model's coordinates
    size_t count = 0;
    for (size_t i = 0; i < state_.units().size(); ++i) {
      const UnitState& u = state_.units()[i];
      if (std::max<uint64_t>(fr.begin, unit_at) < std::min<uint64_t>(fr.end, unit_at + u.numel)) {
        touched_[static_cast<size_t>(f)].push_back(i);
      }
      const uint64_t lo = std::max<uint64_t>(fr.begin, unit_at + u.own.begin);
      const uint64_t hi = std::min<uint64_t>(fr.end, unit_at + u.own.end);
      if (lo < hi) {
        fragments_[static_cast<size_t>(f)].push_back(
            {i, static_cast<size_t>(lo - unit_at - u.own.begin), static_cast<size_t>(hi - lo),
             lo - fr.begin, count});
        count += hi - lo;
      }
      unit_at += u.numel;
    }
    if (cfg.outer_quant != 0) {
      Quantized q{.blocks = (fr.end - fr.begin + kOuterQuantBlock - 1) / kOuterQuantBlock,
                  .count = count};
      for_each_block_run(f, [&](size_t, size_t, uint64_t, size_t k) { q.touched = k + 1; });
      q.payload = 4 * q.touched + code_bytes(count, quant_bits());
      quantized_.push_back(q);
    }
  }
  std::vector<uint64_t> numel;
  for (const UnitState& u : state_.units()) numel.push_back(u.numel);
  // The island's ranks are consecutive in the world, island by island (in turn, the world is
  // one island and the column this rank alone).
  const int world = island_.size() * column_.size();
  const int rank = column_.rank() * island_.size() + island_.index();
  const OuterLayout layout = outer_layout(numel, island_layout(cfg, world), rank);
  if (const std::string d = outer_layout_difference(layout, pieces_layout()); !d.empty()) {
    throw std::logic_error("outer step: its pieces differ from the planned layout's, " + d);
  }
  for (uint64_t own : layout.own) {
    global_.emplace_back(ledger, MemCategory::kOuterState, own);
    momentum_.emplace_back(ledger, MemCategory::kOuterState, own);
  }
  exchange_ = Buffer<float>(ledger, MemCategory::kOuterState, layout.exchange);
  if (layout.whole_master > 0) {
    whole_master_ = Buffer<float>(ledger, MemCategory::kOuterState, layout.whole_master);
  }
  if (cfg.outer_quant != 0) {
    amax_ = Buffer<float>(ledger, MemCategory::kOuterState, layout.amax);
    codes_ = Buffer<int8_t>(ledger, MemCategory::kOuterState, layout.codes);
    payload_ = Buffer<uint8_t>(ledger, MemCategory::kOuterState, layout.payload);
    gathered_ = Buffer<uint8_t>(ledger, MemCategory::kOuterState, layout.gathered);
  }
}

OuterLayout OuterStep::pieces_layout() const {
  OuterLayout o;
  for (const UnitState& u : state_.units()) o.own.push_back(u.own.count());
  for (size_t f = 0; f < fragments_.size(); ++f) {
    OuterFragment& s = o.fragments.emplace_back();
    for (const Piece& p : fragments_[f]) s.count += p.count;
    if (cfg_.outer_quant != 0) {
      const Quantized& q = quantized_[f];
      s.blocks = q.blocks;
      s.touched = q.touched;
      s.payload = q.payload;
    }
  }
  o.size_exchange(cfg_.outer_quant != 0, cfg_.islands);
  if (gathers_offloaded_master()) {
    for (const UnitState& u : state_.units())
      o.whole_master = std::max<uint64_t>(o.whole_master, u.numel);
  }
  return o;
}

OuterStep::~OuterStep() {
  for (Work& w : works_) {
    try {
      w.wait();
    } catch (...) {  // NOLINT(bugprone-empty-catch): see the declaration
    }
  }
}

bool OuterStep::gathers_offloaded_master() const {
  return cfg_.offload != Offload::kNone && !state_.fp32() &&
         state_.plan().optimizer == StagePlan::Extent::kFull && island_.size() > 1;
}

void OuterStep::gather_offloaded_master(size_t i) {
  UnitState& u = state_.units()[i];
  const std::span<float> whole = whole_master_.span().first(u.numel);
  const std::span<float> own = whole.subspan(u.own.begin, u.own.count());
  const StateStore::Job mine{i, {u.opt_own, u.opt_own + u.own.count()}, StateStore::kMaster};
  store_.stream(std::span(&mine, 1), StateStore::Access::kRead, [&](StateStore::Piece& p) {
    std::copy(p.master.begin(), p.master.end(), own.begin() + (p.begin - u.opt_own));
  });
  island_.all_gather_async(own, whole, u.part).wait();
  const StateStore::Job all{i, {0, u.numel}, StateStore::kMaster};
  store_.stream(std::span(&all, 1), StateStore::Access::kWrite, [&](StateStore::Piece& p) {
    std::copy_n(whole.begin() + static_cast<std::ptrdiff_t>(p.begin), p.count, p.master.begin());
  });
}

std::span<float> OuterStep::own_master(UnitState& u) {
  if (state_.fp32()) return {static_cast<float*>(u.params.data()) + u.params_own, u.own.count()};
  return u.master.span().subspan(u.opt_own, u.own.count());
}

std::vector<StateStore::Job> OuterStep::master_jobs(int f, unsigned arrays) const {
  std::vector<StateStore::Job> jobs;
  for (const Piece& p : fragments_[static_cast<size_t>(f)]) {
    const size_t begin = state_.units()[p.unit].opt_own + p.at;
    jobs.push_back({p.unit, {begin, begin + p.count}, arrays});
  }
  return jobs;
}

void OuterStep::begin() {
  std::vector<StateStore::Job> jobs;
  for (size_t i = 0; i < state_.units().size(); ++i) {
    const UnitState& u = state_.units()[i];
    jobs.push_back({i, {u.opt_own, u.opt_own + u.own.count()}, StateStore::kMaster});
  }
  store_.stream(jobs, StateStore::Access::kRead, [&](StateStore::Piece& p) {
    std::copy(p.master.begin(), p.master.end(),
              global_[p.unit].data() + (p.begin - state_.units()[p.unit].opt_own));
  });
}

void OuterStep::send(int f, int64_t merge_at) {
  pending_ = f;
  merge_at_ = merge_at;
  const std::vector<Piece>& pieces = fragments_[static_cast<size_t>(f)];
  const std::vector<StateStore::Job> jobs = master_jobs(f, StateStore::kMaster);
  const size_t at = pieces.empty() ? 0 : pieces.back().buffer_at + pieces.back().count;
  const bool quantized = cfg_.outer_quant != 0;
  held_.for_each([&](int v) {
    // In turn and unquantized, the islands' pseudo-gradients fold here, in island order, as
    // the column's all-reduce folds them.
    const bool fold = v > 0 && !quantized;
    store_.stream(jobs, StateStore::Access::kRead, [&](StateStore::Piece& sp) {
      const size_t skip = sp.begin - jobs[sp.job].range.begin;
      const float* g = global_[sp.unit].data() + pieces[sp.job].at + skip;
      float* d = exchange_.data() + pieces[sp.job].buffer_at + skip;
      if (fold) {
        for (size_t e = 0; e < sp.count; ++e) d[e] = d[e] + (g[e] - sp.master[e]);
      } else {
        for (size_t e = 0; e < sp.count; ++e) d[e] = g[e] - sp.master[e];
      }
    });
    if (quantized) send_quantized(f, v);
  });
  if (quantized) return;
  if (hosted() > 1) {
    const auto divisor = static_cast<float>(cfg_.islands);
    for (float& d : exchange_.span().first(at)) d /= divisor;
  } else {
    works_.push_back(column_.all_reduce_async(exchange_.span().first(at), ReduceOp::kAvg));
  }
}

void OuterStep::send_quantized(int f, int island) {
  const Quantized& q = quantized_[static_cast<size_t>(f)];
  const std::span<float> amax = amax_.span().first(q.blocks);
  std::fill(amax.begin(), amax.end(), 0.0f);
  const std::span<const float> delta = exchange_.span().first(q.count);
  for_each_block_run(f, [&](size_t at, size_t n, uint64_t block, size_t) {
    amax[block] = std::max(amax[block], abs_max(delta.subspan(at, n)));
  });
  // Blocks cross the island's ranks' ranges: each block's scale from all of its parts.
  island_.comm().all_reduce(amax, ReduceOp::kMax);
  auto* payload = reinterpret_cast<std::byte*>(payload_.data());
  const std::span<int8_t> codes = codes_.span().first(q.count);
  for_each_block_run(f, [&](size_t at, size_t n, uint64_t block, size_t k) {
    const float scale = block_scale(amax[block], quant_bits());
    std::memcpy(payload + k * sizeof(float), &scale, sizeof(float));
    quantize_codes(delta.subspan(at, n), scale, quant_bits(), codes.subspan(at, n));
  });
  pack_codes(codes, quant_bits(),
             {payload + q.touched * sizeof(float), code_bytes(q.count, quant_bits())});
  folded_ = false;
  if (hosted() > 1) {
    std::memcpy(gathered_.data() + static_cast<size_t>(island) * q.payload, payload, q.payload);
    return;
  }
  const size_t islands = static_cast<size_t>(cfg_.islands);
  works_.push_back(
      column_.all_gather_async(ConstBuffer(payload, q.payload, DType::kU8),
                               MutableBuffer(gathered_.data(), q.payload * islands, DType::kU8),
                               Partition(q.payload * islands, cfg_.islands)));
}

void OuterStep::finish_exchange() {
  for (Work& w : works_) w.wait();
  works_.clear();
  if (folded_) return;
  const Quantized& q = quantized_[static_cast<size_t>(pending_)];
  const std::span<int8_t> codes = codes_.span().first(q.count);
  float* avg = exchange_.data();
  for (int i = 0; i < cfg_.islands; ++i) {
    const auto* payload =
        reinterpret_cast<const std::byte*>(gathered_.data()) + static_cast<size_t>(i) * q.payload;
    unpack_codes({payload + q.touched * sizeof(float), code_bytes(q.count, quant_bits())},
                 quant_bits(), codes);
    for_each_block_run(pending_, [&](size_t at, size_t n, uint64_t, size_t k) {
      float scale;
      std::memcpy(&scale, payload + k * sizeof(float), sizeof(float));
      for (size_t e = at; e < at + n; ++e) {
        const float y = static_cast<float>(codes[e]) * scale;
        avg[e] = i == 0 ? y : avg[e] + y;
      }
    });
  }
  const auto divisor = static_cast<float>(cfg_.islands);
  for (size_t e = 0; e < q.count; ++e) avg[e] = avg[e] / divisor;
  folded_ = true;
}

void OuterStep::merge(float mix) {
  finish_exchange();
  held_.for_each([&](int v) { merge_island(mix, v == 0); });
  pending_ = -1;
}

void OuterStep::merge_island(float mix, bool outer_update) {
  const float mu = cfg_.outer_momentum;
  const float lr = cfg_.outer_lr;
  std::vector<Work> gathers;
  const std::vector<Piece>& pieces = fragments_[static_cast<size_t>(pending_)];
  // The master and the 16-bit params it rounds into, wherever the store keeps them (the
  // params are read too: a fragment's piece need not fill the file's windows).
  const std::vector<StateStore::Job> jobs =
      master_jobs(pending_, StateStore::kMaster | (state_.fp32() ? 0u : StateStore::kParams));
  store_.stream(jobs, StateStore::Access::kReadWrite, [&](StateStore::Piece& sp) {
    const size_t skip = sp.begin - jobs[sp.job].range.begin;
    const size_t within = pieces[sp.job].at + skip;  // in the unit's own range
    const std::span<float> master = sp.master;
    const float* avg = exchange_.data() + pieces[sp.job].buffer_at + skip;
    float* g = global_[sp.unit].data() + within;
    float* m = momentum_[sp.unit].data() + within;
    if (outer_update) {
      for (size_t e = 0; e < sp.count; ++e) {
        m[e] = mu * m[e] + avg[e];
        g[e] = g[e] - lr * (avg[e] + mu * m[e]);
      }
    }
    for (size_t e = 0; e < sp.count; ++e) {
      master[e] = mix == 1.0f ? g[e] : mix * g[e] + (1.0f - mix) * master[e];
    }
    if (!state_.fp32()) narrow(master, sp.params, state_.dtype(), 0);
  });
  // The island's other copies: the params each rank holds whole (stages 0-2), and the
  // master at stage 0 (at fp32 the params are the master).
  // Whether to gather is the same on every rank of the island (a rank may own all of a
  // small unit cut on the moments' grid, and another none of it).
  const bool island = island_.size() > 1;
  const bool whole_params = state_.plan().params == StagePlan::Extent::kFull;
  const bool whole_master = state_.plan().optimizer == StagePlan::Extent::kFull;
  for (size_t i : touched_[static_cast<size_t>(pending_)]) {
    UnitState& u = state_.units()[i];
    if (island && whole_params) {
      gathers.push_back(island_.all_gather_async(u.params.range(u.params_own, u.own.count()),
                                                 u.params.buffer(), u.part));
    }
    if (island && !state_.fp32() && whole_master) {
      if (gathers_offloaded_master()) {
        gather_offloaded_master(i);  // through one unit-sized buffer: a unit at a time
      } else {
        gathers.push_back(island_.all_gather_async(own_master(u), u.master.span(), u.part));
      }
    }
  }
  for (Work& w : gathers) w.wait();
}

bool OuterStep::after_step(int64_t step) {
  const bool last = step == cfg_.steps;
  bool acted = false;
  if (pending_ >= 0 && (step == merge_at_ || last)) {
    merge(cfg_.outer_mix);
    acted = true;
  }
  for (int f : fragments_ending(cfg_, step)) {
    const int64_t delay = last ? 0 : cfg_.outer_delay;
    send(f, step + delay);
    if (delay == 0) merge(1.0f);
    acted = true;
  }
  return acted;
}

std::optional<int> OuterStep::in_flight(int64_t step) {
  if (pending_ < 0 || merge_at_ <= step) return std::nullopt;
  finish_exchange();
  return pending_;
}

void OuterStep::pending_values(size_t u, std::span<float> own) const {
  std::fill(own.begin(), own.end(), 0.0f);
  if (pending_ < 0) return;
  for (const Piece& p : fragments_[static_cast<size_t>(pending_)]) {
    if (p.unit == u) {
      std::copy_n(exchange_.data() + p.buffer_at, p.count,
                  own.begin() + static_cast<std::ptrdiff_t>(p.at));
    }
  }
}

std::optional<int64_t> OuterStep::sent_before(int64_t step) const {
  for (int64_t d = 0; d < cfg_.outer_delay; ++d) {
    const int64_t t = step - d;
    if (t >= 1 && t < cfg_.steps && !fragments_ending(cfg_, t).empty()) return t;
  }
  return std::nullopt;
}

void OuterStep::restore_pending(int64_t step, size_t u, std::span<const float> own) {
  const std::optional<int64_t> sent = sent_before(step);
  if (!sent) return;
  pending_ = fragments_ending(cfg_, *sent).front();
  merge_at_ = *sent + cfg_.outer_delay;
  folded_ = true;
  for (const Piece& p : fragments_[static_cast<size_t>(pending_)]) {
    if (p.unit == u) {
      std::copy_n(own.begin() + static_cast<std::ptrdiff_t>(p.at), p.count,
                  exchange_.data() + p.buffer_at);
    }
  }
}

}  // namespace zerodp
