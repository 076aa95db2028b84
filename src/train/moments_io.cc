// moments_io.h is the contract.
#include "train/moments_io.h"

#include <algorithm>
#include <vector>

#include "checkpoint/format.h"
#include "optim/moments8.h"

namespace zerodp {
namespace {

using checkpoint::Checkpoint;

std::vector<uint64_t> tensor_sizes(const Unit& unit) {
  std::vector<uint64_t> out;
  for (const TensorSpec& t : unit.tensors()) out.push_back(t.numel);
  return out;
}

// The segments' runs inside `r` (optimizer-range coordinates): f(segment, lo, hi, block), block
// the index among the segment's blocks of the one holding lo (lo is the segment's start or on
// the grid: a partition cut).
template <typename F>
void for_each_run(const UnitState& u, Range r, F f) {
  for (const DecaySegment& s : u.decay) {
    const size_t lo = std::max(s.begin, r.begin), hi = std::min(s.end, r.end);
    if (lo >= hi) continue;
    f(s, lo, hi, s.block_index(lo));
  }
}

Range own_in_opt(const UnitState& u) { return {u.opt_own, u.opt_own + u.own.count()}; }

template <typename T>
std::span<std::byte> bytes(std::span<T> x) {
  return std::as_writable_bytes(x);
}

// A saved unit's moments that are not indexed by element (scales, fp32 parts): elements
// [lo, hi) of the unit (block boundaries) map, in each saved rank's file, to what
// moment_counts counts from that rank's start.
class SavedMoments {
 public:
  SavedMoments(const Checkpoint& ckpt, size_t unit, std::vector<uint64_t> tensors, int island)
      : ckpt_(ckpt),
        unit_(unit),
        tensors_(std::move(tensors)),
        island_(island),
        code_(parse_moment_code(ckpt.meta().moment_code).value_or(kCurrentMomentCode)) {
    uint64_t at = 0;
    for (uint64_t c : ckpt.meta().units.at(unit).counts) {
      starts_.push_back(at);
      at += c;
    }
    starts_.push_back(at);
  }
  // `blocks`: the scales (one per block), else the fp32 parts (one per element).
  void read(std::string_view kind, bool blocks, uint64_t lo, uint64_t hi,
            std::span<float> out) const {
    const auto count = [&](uint64_t a, uint64_t b) {
      const MomentCounts c = moment_counts(tensors_, a, b);
      return blocks ? c.blocks : c.fp32;
    };
    for (size_t r = 0; r + 1 < starts_.size(); ++r) {
      const uint64_t a = std::max(starts_[r], lo), b = std::min(starts_[r + 1], hi);
      if (a >= b) continue;
      const uint64_t n = count(a, b);
      if (n == 0) continue;
      ckpt_.read_rank(static_cast<int>(r), unit_, kind, count(starts_[r], a),
                      bytes(out.subspan(count(lo, a), n)), island_);
    }
  }
  const std::vector<uint64_t>& tensors() const { return tensors_; }
  int island() const { return island_; }
  // The code the checkpoint's bytes are in (check_same_model refused any other name).
  MomentCode code() const { return code_; }
  // The unit's elements [begin, end) of the tensor holding element `g`.
  std::pair<uint64_t, uint64_t> tensor_of(uint64_t g) const {
    uint64_t at = 0;
    for (uint64_t t : tensors_) {
      if (g < at + t) return {at, at + t};
      at += t;
    }
    return {at, at};
  }

 private:
  const Checkpoint& ckpt_;
  size_t unit_;
  std::vector<uint64_t> tensors_;
  int island_;
  MomentCode code_;
  std::vector<uint64_t> starts_;
};

// One moment of elements [lo, hi) of a quantized tensor ([tensor_begin, tensor_end) of the
// unit) decoded from the checkpoint's codes and scales, read by whole blocks.
void decode_saved(const Checkpoint& ckpt, const SavedMoments& saved, size_t unit, bool first,
                  uint64_t tensor_begin, uint64_t tensor_end, uint64_t lo, uint64_t hi,
                  std::span<float> out) {
  const uint64_t b0 = std::max(tensor_begin, lo / kMomentBlock * kMomentBlock);
  const uint64_t b1 = std::min(tensor_end, (hi + kMomentBlock - 1) / kMomentBlock * kMomentBlock);
  const size_t n = b1 - b0;
  const size_t head = std::min<uint64_t>(kMomentBlock - b0 % kMomentBlock, n);
  std::vector<uint8_t> codes(n);
  std::vector<float> scales(moment_blocks(n, head)), values(n);
  ckpt.read(unit, first ? "adam_m8" : "adam_v8", b0, bytes(std::span(codes)), saved.island());
  saved.read(first ? "adam_m8_scale" : "adam_v8_scale", true, b0, b1, scales);
  dequantize_moment_run(codes, scales, head, first, values, saved.code());
  std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(lo - b0), hi - lo, out.begin());
}

// The own range's block scales of one moment, in order.
void stream_scales(const UnitState& u, bool first, const ByteSink& sink) {
  const std::span<const float> scales = first ? u.m_scales.span() : u.v_scales.span();
  for_each_run(u, own_in_opt(u), [&](const DecaySegment& s, size_t lo, size_t hi, size_t block) {
    if (s.quantized) sink(std::as_bytes(scales.subspan(s.block_at + block, s.block_count(lo, hi))));
  });
}

// The own range's elements of the tensors whose moments stay fp32, of one moment.
void stream_fp32_moments(const UnitState& u, bool first, const ByteSink& sink) {
  const std::span<const float> values = first ? u.adam_m.span() : u.adam_v.span();
  for_each_run(u, own_in_opt(u), [&](const DecaySegment& s, size_t lo, size_t hi, size_t) {
    if (!s.quantized) sink(std::as_bytes(values.subspan(s.at + (lo - s.begin), hi - lo)));
  });
}

}  // namespace

void int8_moment_tensors(const ShardedState& state, size_t i, std::vector<ShardTensor>& out) {
  using checkpoint::tensor_name;
  namespace st = safetensors;
  const UnitState& u = state.units()[i];
  const Range own = own_in_opt(u);
  const MomentCounts c =
      moment_counts(tensor_sizes(*u.unit), u.own.begin, u.own.begin + u.own.count());
  const auto decl = [&](const char* kind, st::ElementType type, uint64_t n) {
    return st::TensorDecl{tensor_name(u.unit->name(), kind), type, {static_cast<int64_t>(n)}};
  };
  // The codes: the store's, offloaded or not (0 at the fp32 tensors' elements).
  for (const bool first : {true, false}) {
    out.push_back({.decl = decl(first ? "adam_m8" : "adam_v8", st::ElementType::kU8, own.count()),
                   .unit = i,
                   .array = first ? StateStore::kAdamM : StateStore::kAdamV,
                   .range = own,
                   .bytes = {},
                   .copy_at_boundary = false});
  }
  // The scales, then the fp32 tensors' moments: memory's, of the island active when written.
  const ShardedState* held = &state;
  const auto memory = [&](const char* kind, uint64_t n, bool first, bool scales) {
    out.push_back({.decl = decl(kind, st::ElementType::kF32, n),
                   .unit = i,
                   .array = 0,
                   .range = {},
                   .bytes =
                       [held, i, first, scales](const ByteSink& sink) {
                         const UnitState& unit = held->units()[i];
                         if (scales) {
                           stream_scales(unit, first, sink);
                         } else {
                           stream_fp32_moments(unit, first, sink);
                         }
                       },
                   .copy_at_boundary = false});
  };
  memory("adam_m8_scale", c.blocks, true, true);
  memory("adam_v8_scale", c.blocks, false, true);
  memory("adam_m", c.fp32, true, false);
  memory("adam_v", c.fp32, false, false);
}

namespace {

// Unit i's 8-bit moments of elements `r` of its optimizer range from `ckpt`: the codes into
// `m8`/`v8`, the store's piece of `r`.
void load_int8_range(UnitState& u, const Checkpoint& ckpt, const SavedMoments& saved, size_t i,
                     Range r, std::span<uint8_t> m8, std::span<uint8_t> v8) {
  const bool saved8 = ckpt.meta().int8_moments;
  const size_t base = u.opt_range.begin;
  for_each_run(u, r, [&](const DecaySegment& s, size_t lo, size_t hi, size_t) {
    const size_t n = hi - lo;
    const uint64_t g0 = base + lo, g1 = base + hi;
    if (s.quantized) {
      const QuantizedMoments q = u.quantized(s, lo, n, m8, v8, r.begin);
      if (saved8 && saved.code() != kCurrentMomentCode) {
        // Another code's bytes (a checkpoint written before this one): decoded, then encoded
        // as a step would.
        const auto [t0, t1] = saved.tensor_of(g0);
        std::vector<float> m(n), v(n);
        decode_saved(ckpt, saved, i, true, t0, t1, g0, g1, m);
        decode_saved(ckpt, saved, i, false, t0, t1, g0, g1, v);
        quantize_moments(m, v, q);
      } else if (saved8) {  // the saving run's codes and scales, as they were
        ckpt.read(i, "adam_m8", g0, bytes(q.m), saved.island());
        ckpt.read(i, "adam_v8", g0, bytes(q.v), saved.island());
        saved.read("adam_m8_scale", true, g0, g1, q.m_scale);
        saved.read("adam_v8_scale", true, g0, g1, q.v_scale);
      } else {  // fp32 moments, encoded as a step would
        std::vector<float> m(n), v(n);
        ckpt.read(i, "adam_m", g0, bytes(std::span(m)), saved.island());
        ckpt.read(i, "adam_v", g0, bytes(std::span(v)), saved.island());
        quantize_moments(m, v, q);
      }
      return;
    }
    const std::span<float> m = u.adam_m.span().subspan(s.at + (lo - s.begin), n);
    const std::span<float> v = u.adam_v.span().subspan(s.at + (lo - s.begin), n);
    if (saved8) {
      saved.read("adam_m", false, g0, g1, m);
      saved.read("adam_v", false, g0, g1, v);
    } else {
      ckpt.read(i, "adam_m", g0, bytes(m), saved.island());
      ckpt.read(i, "adam_v", g0, bytes(v), saved.island());
    }
  });
}

}  // namespace

void load_moments(ShardedState& state, StateStore& store, const Checkpoint& ckpt, size_t i,
                  int island) {
  UnitState& u = state.units()[i];
  const SavedMoments saved(ckpt, i, tensor_sizes(*u.unit), island);
  const size_t base = u.opt_range.begin;
  const size_t n = u.opt_range.count();
  if (state.int8_moments()) {
    // The store's codes, piece by piece (0 at the fp32 tensors' elements).
    const StateStore::Job job{i, {0, n}, StateStore::kAdamM | StateStore::kAdamV};
    store.stream(std::span(&job, 1), StateStore::Access::kWrite, [&](StateStore::Piece& p) {
      std::ranges::fill(p.m8, uint8_t{0});
      std::ranges::fill(p.v8, uint8_t{0});
      load_int8_range(u, ckpt, saved, i, {p.begin, p.begin + p.count}, p.m8, p.v8);
    });
    return;
  }
  // An fp32 run from 8-bit moments: decoded, tensor by tensor, into the store's pieces.
  const std::vector<StateStore::Job> jobs{{i, {0, n}, StateStore::kAdamM},
                                          {i, {0, n}, StateStore::kAdamV}};
  store.stream(jobs, StateStore::Access::kWrite, [&](StateStore::Piece& p) {
    const bool first = !p.m.empty();
    const std::span<float> out = first ? p.m : p.v;
    const uint64_t g0 = base + p.begin, g1 = g0 + p.count;
    uint64_t at = 0;
    for (uint64_t t : saved.tensors()) {
      const uint64_t lo = std::max(at, g0), hi = std::min(at + t, g1);
      if (lo < hi) {
        const std::span<float> part = out.subspan(lo - g0, hi - lo);
        if (moments_quantized(t)) {
          decode_saved(ckpt, saved, i, first, at, at + t, lo, hi, part);
        } else {
          saved.read(first ? "adam_m" : "adam_v", false, lo, hi, part);
        }
      }
      at += t;
    }
  });
}

}  // namespace zerodp
