// state_layout.h is the contract.
#include "train/state_layout.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/core.h>

#include "core/error.h"
#include "optim/moments8.h"

namespace zerodp {

uint64_t LayoutPlan::grain() const { return int8_moments || moments4 ? kMomentBlock : 1; }

LayoutPlan layout_plan(const TrainConfig& c) {
  return layout_plan(c, StagePlan::make(c.stage, AccumulatePolicy::kReduce, fp32_accumulator(c)));
}

LayoutPlan layout_plan(const TrainConfig& c, const StagePlan& stage) {
  return LayoutPlan{.stage = stage,
                    .precision = c.precision,
                    .offload = c.offload,
                    .int8_moments = c.int8_moments};
}

LayoutPlan layout_plan(int stage, Precision precision, bool fp32_accumulator, Offload offload,
                       bool int8_moments) {
  // The extents do not depend on the policy; the accumulator decides whether stages 2-3
  // hold their grads in fp32.
  return LayoutPlan{.stage = StagePlan::make(stage, AccumulatePolicy::kReduce, fp32_accumulator),
                    .precision = precision,
                    .offload = offload,
                    .int8_moments = int8_moments};
}

Range own_range(uint64_t numel, int world, int rank, uint64_t grain) {
  if (world < 1) {
    throw InvalidArgument(fmt::format("partition: world size {} is invalid; use 1 or more", world));
  }
  if (rank < 0 || rank >= world) {
    throw InvalidArgument(
        fmt::format("partition: rank {} is outside world of {} ranks", rank, world));
  }
  const uint64_t n = static_cast<uint64_t>(world), r = static_cast<uint64_t>(rank);
  const uint64_t grains = (numel + grain - 1) / grain;
  const uint64_t b = r * (grains / n) + std::min(r, grains % n);
  const uint64_t e = b + grains / n + (r < grains % n ? 1 : 0);
  const uint64_t begin = std::min(b * grain, numel);
  return {begin, std::min(e * grain, numel)};
}

uint64_t Holding::file_bytes() const {
  return (bytes() + kOffloadAlign - 1) / kOffloadAlign * kOffloadAlign;
}

namespace {

using E = StateEntry;

// Muon's momentum: the matrices this rank owns (every one where the optimizer range is the
// whole unit); returns the matrices' elements inside the optimizer range, which Adam then
// leaves to Muon.
uint64_t lay_out_muon(const LayoutPlan& p, const UnitShape& u, UnitLayout& l) {
  uint64_t at = 0, held = 0, in_range = 0;
  for (size_t i = 0; i < u.tensors.size(); ++i) {
    const uint64_t t = u.tensors[i];
    if (i < u.matrix.size() && u.matrix[i] != 0 && t > 0) {
      const bool owner =
          p.stage.optimizer == StagePlan::Extent::kFull || (at >= l.own.begin && at < l.own.end);
      held += owner ? t : 0;
      const uint64_t b = std::max<uint64_t>(at, l.optimizer.begin);
      const uint64_t e = std::min<uint64_t>(at + t, l.optimizer.end);
      in_range += b < e ? e - b : 0;
    }
    at += t;
  }
  l[E::kMuonMomentum] = {held, 32, p.offload != Offload::kNone};
  return in_range;
}

// Adam's moments over the optimizer range less `taken` elements (Muon's), fp32; or quantized
// (8 or 4 bits a code): codes of the large tensors' elements and a scale per block of the
// kMomentBlock grid, the small tensors in fp32. Offloaded, the file keeps a code slot for
// every element of the range (the tier's pieces are whole ranges) and the scales and fp32
// moments stay in memory.
void lay_out_moments(const LayoutPlan& p, const UnitShape& u, uint64_t taken, UnitLayout& l) {
  const bool offloaded = p.offload != Offload::kNone;
  const uint64_t opt = l.optimizer.count();
  if (!p.int8_moments && !p.moments4) {
    l[E::kAdamM] = {opt - taken, 32, offloaded};
    l[E::kAdamV] = {opt - taken, 32, offloaded};
    return;
  }
  if (p.int8_moments && p.moments4) {
    throw std::logic_error("state layout: 8-bit and 4-bit moments at once");
  }
  if (taken > 0) {
    throw std::logic_error("state layout: Muon beside quantized moments is not laid out yet");
  }
  const uint64_t whole[] = {u.numel};
  const std::span<const uint64_t> tensors = u.tensors.empty() ? whole : u.tensors;
  const MomentCounts mc = moment_counts(tensors, l.optimizer.begin, l.optimizer.end);
  const uint32_t bits = p.int8_moments ? 8 : 4;
  const Holding codes = offloaded ? Holding{opt, bits, true} : Holding{mc.codes, bits, false};
  l[E::kAdamM] = {mc.fp32, 32, false};
  l[E::kAdamV] = {mc.fp32, 32, false};
  l[p.int8_moments ? E::kCodesM : E::kCodes4M] = codes;
  l[p.int8_moments ? E::kCodesV : E::kCodes4V] = codes;
  l[p.int8_moments ? E::kScalesM : E::kScales4M] = {mc.blocks, 32, false};
  l[p.int8_moments ? E::kScalesV : E::kScales4V] = {mc.blocks, 32, false};
}

}  // namespace

UnitLayout unit_layout(const LayoutPlan& p, const UnitShape& u, int shards, int index) {
  // Only the entries that read the tensors need them to add up to the unit (the planner asks
  // the layout of every rank of a million-rank world: the check is not free).
  if ((p.int8_moments || p.moments4 || p.muon) && !u.tensors.empty()) {
    uint64_t sum = 0;
    for (uint64_t t : u.tensors) sum += t;
    if (sum != u.numel) {
      throw std::logic_error(fmt::format(
          "state layout: a unit of {} elements given tensors of {} in all", u.numel, sum));
    }
  }
  const StagePlan& sp = p.stage;
  const bool fp32 = p.precision == Precision::kFP32;
  const bool offloaded = p.offload != Offload::kNone;
  UnitLayout l;
  l.own = own_range(u.numel, shards, index, p.grain());
  l.params = StagePlan::held(sp.params, l.own, u.numel);
  l.grads = StagePlan::held(sp.grads, l.own, u.numel);
  l.optimizer = StagePlan::held(sp.optimizer, l.own, u.numel);
  const uint32_t w = fp32 ? 32 : 16;
  const uint64_t opt = l.optimizer.count();
  // With --offload optimizer,params the parameter shard is a region of the file (at fp32 the
  // one region it shares with the master, which it is).
  l[E::kParams] = {l.params.count(), w, p.offload == Offload::kParams};
  l[E::kGrads] = {l.grads.count(), sp.grads_fp32 ? 32u : w, false};
  if (!fp32 && p.master_remainder) {
    if (p.precision != Precision::kBF16) {
      throw std::logic_error("state layout: a master remainder needs bf16 parameters");
    }
    l[E::kMasterRemainder] = {opt, 16, offloaded};
    l[E::kMasterTieBits] = {opt, 1, offloaded};
  } else if (!fp32) {
    l[E::kMaster] = {opt, 32, offloaded};
  }
  const uint64_t taken = p.muon ? lay_out_muon(p, u, l) : 0;
  lay_out_moments(p, u, taken, l);
  if (p.error_feedback) l[E::kErrorFeedback] = {l.own.count(), 32, false};
  return l;
}

OffloadElement offload_element(const LayoutPlan& p) {
  // One element held whole: every in-file entry counts it once.
  const UnitLayout one = unit_layout(p, UnitShape{.numel = 1}, 1, 0);
  OffloadElement e;
  for (size_t k = 0; k < one.entries.size(); ++k) {
    const Holding& h = one.entries[k];
    if (!h.in_file || h.count == 0) continue;
    if (h.bits % 8 != 0) {
      throw std::logic_error(
          fmt::format("state layout: the offload file cannot hold {}, {} bits an element",
                      kStateEntrySpecs[k].name, h.bits));
    }
    e.bytes += h.bits / 8;
    e.narrowest = e.narrowest == 0 ? h.bits / 8 : std::min<uint64_t>(e.narrowest, h.bits / 8);
  }
  if (e.bytes == 0) throw std::logic_error("state layout: the offload file holds nothing");
  return e;
}

UnitLayout all_ranks_layout(const LayoutPlan& p, const UnitShape& unit, int shards) {
  UnitLayout all = unit_layout(p, unit, 1, 0);
  const auto whole = [&](Covers c) {
    switch (c) {
      case Covers::kParams:
        return p.stage.params == StagePlan::Extent::kFull;
      case Covers::kGrads:
        return p.stage.grads == StagePlan::Extent::kFull;
      case Covers::kOptimizer:
        return p.stage.optimizer == StagePlan::Extent::kFull;
      case Covers::kOwn:
        return false;
    }
    return false;
  };
  for (size_t k = 0; k < all.entries.size(); ++k) {
    if (whole(kStateEntrySpecs[k].covers)) all.entries[k].count *= static_cast<uint64_t>(shards);
  }
  return all;
}

ShardUnitBytes checkpoint_shard_bytes(const LayoutPlan& p, const UnitShape& unit, int shards,
                                      int index, bool outer, bool pending) {
  // Every extent the own range, in memory: the holdings of exactly what the shard keeps.
  LayoutPlan own = p;
  own.stage.params = own.stage.grads = own.stage.optimizer = StagePlan::Extent::kOwn;
  own.offload = Offload::kNone;
  const UnitLayout l = unit_layout(own, unit, shards, index);
  const uint64_t n = l.own.count();
  ShardUnitBytes b;
  for (size_t k = 0; k < l.entries.size(); ++k) {
    const Holding& h = l.entries[k];
    switch (static_cast<E>(k)) {
      case E::kGrads:  // a step's, never saved
        break;
      case E::kCodesM:
      case E::kCodesV:
        // The shard's codes are [c_r] like its other states (docs/checkpoint_format.md): a
        // code for every element of the range, 0 at the fp32 tensors'.
        b.states += Holding{.count = n, .bits = h.bits}.bytes();
        break;
      case E::kParams:
      case E::kMaster:
      case E::kAdamM:
      case E::kAdamV:
      case E::kScalesM:
      case E::kScalesV:
        b.states += h.bytes();
        break;
      default:
        if (h.count > 0) {
          throw std::logic_error(fmt::format(
              "checkpoint shard: the state layout holds {}, which no checkpoint saves yet",
              kStateEntrySpecs[k].name));
        }
    }
  }
  if (outer) b.outer = 2 * 4 * n;
  if (pending) b.pending = 4 * n;
  return b;
}

LayoutBytes& LayoutBytes::operator+=(const UnitLayout& l) {
  for (size_t k = 0; k < l.entries.size(); ++k) {
    const Holding& h = l.entries[k];
    if (h.count == 0) continue;
    if (h.in_file) {
      file += h.file_bytes();
    } else {
      memory[static_cast<size_t>(kStateEntrySpecs[k].category)] += h.bytes();
    }
  }
  return *this;
}

}  // namespace zerodp
