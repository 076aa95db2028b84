// sharded_state.h is the contract.
#include "train/sharded_state.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/core.h>

#include "models/init.h"
#include "optim/moments8.h"
#include "train/flat.h"

namespace zerodp {

DType param_dtype(Precision p) {
  switch (p) {
    case Precision::kBF16:
      return DType::kBF16;
    case Precision::kFP16:
      return DType::kF16;
    case Precision::kFP32:
      return DType::kF32;
  }
  return DType::kF32;
}

std::span<float> UnitState::master_values() {
  if (params.dtype == DType::kF32) {
    return {static_cast<float*>(params.data()) + params_opt, opt_range.count()};
  }
  return master.span();
}

std::span<const float> UnitState::master_values() const {
  return const_cast<UnitState*>(this)->master_values();
}

QuantizedMoments UnitState::quantized(const DecaySegment& s, size_t b, size_t len,
                                      std::span<uint8_t> m8, std::span<uint8_t> v8,
                                      size_t piece_begin) {
  const auto codes = [&](std::span<uint8_t> piece, Buffer<uint8_t>& held_codes) {
    if (!piece.empty()) return piece.subspan(b - piece_begin, len);
    return held_codes.span().subspan(s.at + (b - s.begin), len);
  };
  const size_t block = s.block_at + s.block_index(b), blocks = s.block_count(b, b + len);
  return {.m = codes(m8, m_codes),
          .v = codes(v8, v_codes),
          .m_scale = m_scales.span().subspan(block, blocks),
          .v_scale = v_scales.span().subspan(block, blocks),
          .first = b == s.begin ? s.first : kMomentBlock};
}

void fill_codes_of_zero(const UnitState& u, size_t begin, std::span<uint8_t> m,
                        std::span<uint8_t> v) {
  std::ranges::fill(m, uint8_t{0});
  std::ranges::fill(v, uint8_t{0});
  const size_t end = begin + m.size();
  for (const DecaySegment& s : u.decay) {
    const size_t lo = std::max(s.begin, begin), hi = std::min(s.end, end);
    if (!s.quantized || lo >= hi) continue;
    std::fill(m.begin() + static_cast<std::ptrdiff_t>(lo - begin),
              m.begin() + static_cast<std::ptrdiff_t>(hi - begin), encode_moment(0.0f, true));
    std::fill(v.begin() + static_cast<std::ptrdiff_t>(lo - begin),
              v.begin() + static_cast<std::ptrdiff_t>(hi - begin), encode_moment(0.0f, false));
  }
}

namespace {

// Every rank initializes exactly the ranges it holds, from the pure init function, so the
// starting model is the same for every N and stage and no rank materializes what it does
// not keep. `held` covers the optimizer range (all of the unit below stage 3; at stage 3
// held == own == the optimizer range). `skip`, a part of `held`, is left to the offload
// tier, which computes those values once for the master in its file and rounds them into
// the params here.
void initialize(UnitState& u, uint64_t seed, Range skip) {
  if (u.params.count == 0 && u.master.empty()) return;
  std::vector<float> tmp;
  constexpr size_t kChunk = 1 << 20;
  for (size_t b = u.held.begin, e = 0; b < u.held.end; b = e) {
    if (b >= skip.begin && b < skip.end) {
      e = skip.end;
      continue;
    }
    e = std::min({u.held.end, b + kChunk, b < skip.begin ? skip.begin : u.held.end});
    tmp.resize(e - b);
    initialize_range(seed, *u.unit, b, e, tmp);
    narrow(tmp, u.params.data(), u.params.dtype, b - u.held.begin);
    if (!u.master.empty() && b < u.opt_range.end && e > u.opt_range.begin) {
      const size_t ob = std::max(b, u.opt_range.begin);
      const size_t oe = std::min(e, u.opt_range.end);
      std::copy(tmp.begin() + static_cast<std::ptrdiff_t>(ob - b),
                tmp.begin() + static_cast<std::ptrdiff_t>(oe - b),
                u.master.data() + (ob - u.opt_range.begin));
    }
  }
}

// Where each tensor's moments live (DecaySegment), and the moments' buffers as the layout
// sizes them: quantized tensors' blocks are their parts of the unit's kMomentBlock grid,
// starting at zero (Adam's moments start at 0). The segments count the same elements the
// layout does, from the tensors: a difference is a bug in one of them.
void lay_out_moments(UnitState& u, MemoryLedger& ledger, const UnitLayout& l, bool int8) {
  size_t fp32 = 0, codes = 0, blocks = 0;
  for (DecaySegment& s : u.decay) {
    const size_t n = s.end - s.begin;
    if (s.quantized) {
      const size_t global = u.opt_range.begin + s.begin;
      s.first = std::min(kMomentBlock - global % kMomentBlock, n);
      s.at = codes;
      s.block_at = blocks;
      codes += n;
      blocks += moment_blocks(n, s.first);
    } else {
      s.at = fp32;
      fp32 += n;
    }
  }
  using E = StateEntry;
  const uint64_t codes_held = l[E::kCodesM].in_file ? codes : l[E::kCodesM].count;
  if (int8 ? (l[E::kAdamM].count != fp32 || codes_held != codes || l[E::kScalesM].count != blocks)
           : l[E::kAdamM].count != u.opt_range.count()) {
    throw std::logic_error(fmt::format(
        "sharded state: the layout holds {} fp32 moments, {} codes and {} blocks; the tensors "
        "{}, {} and {}",
        l[E::kAdamM].count, codes_held, l[E::kScalesM].count, fp32, codes, blocks));
  }
  // Offloaded, the file holds the fp32 moments, or the codes (OffloadTier::initialize).
  const auto held = [&l](E e) { return l[e].in_file ? 0 : l[e].count; };
  u.adam_m = Buffer<float>(ledger, MemCategory::kAdamM, held(E::kAdamM));
  u.adam_v = Buffer<float>(ledger, MemCategory::kAdamV, held(E::kAdamV));
  u.m_scales = Buffer<float>(ledger, MemCategory::kAdamM, held(E::kScalesM));
  u.v_scales = Buffer<float>(ledger, MemCategory::kAdamV, held(E::kScalesV));
  u.m_codes = Buffer<uint8_t>(ledger, MemCategory::kAdamM, held(E::kCodesM));
  u.v_codes = Buffer<uint8_t>(ledger, MemCategory::kAdamV, held(E::kCodesV));
  // Zero moments: the code of 0 with scale 0 (any code decodes to 0 under scale 0; the
  // first moment's own zero keeps a fresh state's bytes plain).
  std::ranges::fill(u.m_codes.span(), encode_moment(0.0f, true));
  std::ranges::fill(u.v_codes.span(), encode_moment(0.0f, false));
}

}  // namespace

ShardedState::ShardedState(const Model& model, const StagePlan& plan, Precision precision,
                           bool products_read_bf16, bool decay_all, uint64_t seed, int world,
                           int rank, MemoryLedger& ledger, Offload offload, bool int8_moments)
    : ShardedState(model,
                   LayoutPlan{.stage = plan,
                              .precision = precision,
                              .offload = offload,
                              .int8_moments = int8_moments},
                   products_read_bf16, decay_all, seed, world, rank, ledger) {}

ShardedState::ShardedState(const Model& model, const LayoutPlan& layout, bool products_read_bf16,
                           bool decay_all, uint64_t seed, int world, int rank, MemoryLedger& ledger)
    : plan_(layout.stage),
      dtype_(param_dtype(layout.precision)),
      int8_moments_(layout.int8_moments) {
  using E = StagePlan;
  const StagePlan& plan = plan_;
  units_.resize(model.size());
  for (size_t i = 0; i < model.size(); ++i) {
    UnitState& u = units_[i];
    u.unit = model[i].get();
    u.numel = u.unit->numel();
    max_numel_ = std::max(max_numel_, u.numel);
    std::vector<uint64_t> tensors;
    for (const TensorSpec& t : u.unit->tensors()) tensors.push_back(t.numel);
    const UnitLayout l = unit_layout(layout, {.numel = u.numel, .tensors = tensors}, world, rank);
    u.part = Partition::aligned(u.numel, world, layout.grain());
    if (u.part.range(rank) != l.own) {
      throw std::logic_error(fmt::format(
          "sharded state: unit {} of {} elements: the layout's range [{}, {}) is not the "
          "partition's [{}, {}) on rank {} of {}",
          i, u.numel, l.own.begin, l.own.end, u.part.range(rank).begin, u.part.range(rank).end,
          rank, world));
    }
    u.own = l.own;
    u.held = l.params;
    u.opt_range = l.optimizer;
    u.layout = l;
    u.params_own = E::offset(plan.params, u.own, u.own.begin);
    u.params_opt = E::offset(plan.params, u.own, u.opt_range.begin);
    u.grads_own = E::offset(plan.grads, u.own, u.own.begin);
    u.grads_opt = E::offset(plan.grads, u.own, u.opt_range.begin);
    u.opt_own = u.own.begin - u.opt_range.begin;
    const Holding& params = l[StateEntry::kParams];
    const Holding& grads = l[StateEntry::kGrads];
    const Holding& master = l[StateEntry::kMaster];
    u.params = Flat(ledger, MemCategory::kParams, dtype_, params.in_file ? 0 : params.count);
    u.grads =
        Flat(ledger, MemCategory::kGrads, grads.bits == 32 ? DType::kF32 : dtype_, grads.count);
    if (!master.in_file && master.count > 0) {
      u.master = Buffer<float>(ledger, MemCategory::kMaster, master.count);
    }
    for (const TensorSpec& t : u.unit->tensors()) {
      if (products_read_bf16 && t.use == TensorUse::kProductOperand) continue;
      if (!u.widen.empty() && u.widen.back().end == t.offset) {
        u.widen.back().end += t.numel;
      } else {
        u.widen.push_back({t.offset, t.offset + t.numel});
      }
    }
    // Decay policy as data: one segment per tensor overlapping the optimizer range.
    for (const TensorSpec& t : u.unit->tensors()) {
      const size_t b = std::max(t.offset, u.opt_range.begin);
      const size_t e = std::min(t.offset + t.numel, u.opt_range.end);
      if (b < e) {
        u.decay.push_back({.begin = b - u.opt_range.begin,
                           .end = e - u.opt_range.begin,
                           .decay = decay_all || t.weight_decay,
                           .quantized = int8_moments_ && moments_quantized(t.numel)});
      }
    }
    lay_out_moments(u, ledger, l, int8_moments_);
    // 16-bit parameters beside an offloaded master: the tier writes both from one pass.
    const bool tier_rounds = layout.offload == Offload::kOptimizer && !fp32();
    initialize(u, seed, tier_rounds ? u.opt_range : Range{});
  }
}

uint64_t ShardedState::params() const {
  uint64_t p = 0;
  for (const auto& u : units_) p += u.numel;
  return p;
}

}  // namespace zerodp
