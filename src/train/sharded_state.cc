// sharded_state.h is the contract.
#include "train/sharded_state.h"

#include <algorithm>

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

// Where each tensor's moments live (DecaySegment), and the int8 buffers sized to hold them:
// quantized tensors' blocks are their parts of the unit's kMomentBlock grid, starting at
// zero (Adam's moments start at 0).
void lay_out_moments(UnitState& u, MemoryLedger& ledger, bool int8, bool offloaded) {
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
  // Offloaded, the file holds the fp32 moments, or the codes (OffloadTier::initialize).
  if (offloaded && !int8) return;
  u.adam_m = Buffer<float>(ledger, MemCategory::kAdamM, int8 ? fp32 : u.opt_range.count());
  u.adam_v = Buffer<float>(ledger, MemCategory::kAdamV, int8 ? fp32 : u.opt_range.count());
  if (!int8) return;
  u.m_scales = Buffer<float>(ledger, MemCategory::kAdamM, blocks);
  u.v_scales = Buffer<float>(ledger, MemCategory::kAdamV, blocks);
  if (offloaded) return;
  u.m_codes = Buffer<uint8_t>(ledger, MemCategory::kAdamM, codes);
  u.v_codes = Buffer<uint8_t>(ledger, MemCategory::kAdamV, codes);
  // Zero moments: the code of 0 with scale 0 (any code decodes to 0 under scale 0; the
  // first moment's own zero keeps a fresh state's bytes plain).
  std::ranges::fill(u.m_codes.span(), encode_moment(0.0f, true));
  std::ranges::fill(u.v_codes.span(), encode_moment(0.0f, false));
}

}  // namespace

ShardedState::ShardedState(const Model& model, const StagePlan& plan, Precision precision,
                           bool products_read_bf16, bool decay_all, uint64_t seed, int world,
                           int rank, MemoryLedger& ledger, Offload offload, bool int8_moments)
    : plan_(plan), dtype_(param_dtype(precision)), int8_moments_(int8_moments) {
  using E = StagePlan;
  units_.resize(model.size());
  for (size_t i = 0; i < model.size(); ++i) {
    UnitState& u = units_[i];
    u.unit = model[i].get();
    u.numel = u.unit->numel();
    max_numel_ = std::max(max_numel_, u.numel);
    u.part =
        int8_moments ? Partition::aligned(u.numel, world, kMomentBlock) : Partition(u.numel, world);
    u.own = u.part.range(rank);
    u.held = E::held(plan.params, u.own, u.numel);
    u.opt_range = E::held(plan.optimizer, u.own, u.numel);
    u.params_own = E::offset(plan.params, u.own, u.own.begin);
    u.params_opt = E::offset(plan.params, u.own, u.opt_range.begin);
    u.grads_own = E::offset(plan.grads, u.own, u.own.begin);
    u.grads_opt = E::offset(plan.grads, u.own, u.opt_range.begin);
    u.opt_own = u.own.begin - u.opt_range.begin;
    u.params = Flat(ledger, MemCategory::kParams, dtype_,
                    offload == Offload::kParams ? 0 : u.held.count());
    u.grads = Flat(ledger, MemCategory::kGrads, plan.grads_fp32 ? DType::kF32 : dtype_,
                   E::held(plan.grads, u.own, u.numel).count());
    const size_t opt = u.opt_range.count();
    if (offload == Offload::kNone && !fp32()) {
      u.master = Buffer<float>(ledger, MemCategory::kMaster, opt);
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
                           .quantized = int8_moments && moments_quantized(t.numel)});
      }
    }
    lay_out_moments(u, ledger, int8_moments, offload != Offload::kNone);
    // 16-bit parameters beside an offloaded master: the tier writes both from one pass.
    const bool tier_rounds = offload == Offload::kOptimizer && !fp32();
    initialize(u, seed, tier_rounds ? u.opt_range : Range{});
  }
}

uint64_t ShardedState::params() const {
  uint64_t p = 0;
  for (const auto& u : units_) p += u.numel;
  return p;
}

}  // namespace zerodp
