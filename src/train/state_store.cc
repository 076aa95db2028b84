// state_store.h is the contract.
#include "train/state_store.h"

#include <algorithm>
#include <vector>

namespace zerodp {

void MemoryStore::stream(std::span<const Job> jobs, Access, const std::function<void(Piece&)>& f) {
  // The codes of fp32 tensors' elements: zeros, written afresh for each piece.
  std::vector<uint8_t> zeros_m, zeros_v;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    UnitState& u = state_.units()[job.unit];
    const auto piece = [&](Range r, bool first, bool last) {
      const size_t n = r.count();
      Piece p{.job = j,
              .unit = job.unit,
              .begin = r.begin,
              .first = first,
              .last = last,
              .count = n,
              .master = {},
              .m = {},
              .v = {},
              .m8 = {},
              .v8 = {},
              .params = nullptr};
      if (job.arrays & kMaster) p.master = u.master_values().subspan(r.begin, n);
      if ((job.arrays & kAdamM) && !state_.int8_moments()) {
        p.m = u.adam_m.span().subspan(r.begin, n);
      }
      if ((job.arrays & kAdamV) && !state_.int8_moments()) {
        p.v = u.adam_v.span().subspan(r.begin, n);
      }
      if (job.arrays & kParams) p.params = u.params.at(u.params_opt + r.begin);
      return p;
    };
    if (!state_.int8_moments() || (job.arrays & (kAdamM | kAdamV)) == 0) {
      Piece p = piece(job.range, true, true);
      f(p);
      continue;
    }
    std::vector<const DecaySegment*> crossed;
    for (const DecaySegment& s : u.decay) {
      if (std::max(s.begin, job.range.begin) < std::min(s.end, job.range.end)) {
        crossed.push_back(&s);
      }
    }
    for (size_t k = 0; k < crossed.size(); ++k) {
      const DecaySegment& s = *crossed[k];
      const Range r{std::max(s.begin, job.range.begin), std::min(s.end, job.range.end)};
      Piece p = piece(r, k == 0, k + 1 == crossed.size());
      const auto codes = [&](Buffer<uint8_t>& held, std::vector<uint8_t>& zeros) {
        if (s.quantized) return held.span().subspan(s.at + (r.begin - s.begin), r.count());
        zeros.assign(r.count(), 0);
        return std::span<uint8_t>(zeros);
      };
      if (job.arrays & kAdamM) p.m8 = codes(u.m_codes, zeros_m);
      if (job.arrays & kAdamV) p.v8 = codes(u.v_codes, zeros_v);
      f(p);
    }
  }
}

}  // namespace zerodp
