#include "train/state_store.h"

#include <stdexcept>

namespace zerodp {

void MemoryStore::stream(std::span<const Job> jobs, Access, const std::function<void(Piece&)>& f) {
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    UnitState& u = state_.units()[job.unit];
    const size_t n = job.range.count();
    Piece p{.job = j,
            .unit = job.unit,
            .begin = job.range.begin,
            .first = true,
            .last = true,
            .count = n,
            .master = {},
            .m = {},
            .v = {},
            .m8 = {},
            .v8 = {},
            .params = nullptr};
    if (job.arrays & kMaster) p.master = u.master_values().subspan(job.range.begin, n);
    if ((job.arrays & (kAdamM | kAdamV)) && state_.int8_moments()) {
      throw std::logic_error("MemoryStore: 8-bit moments are read by segment, not streamed");
    }
    if (job.arrays & kAdamM) p.m = u.adam_m.span().subspan(job.range.begin, n);
    if (job.arrays & kAdamV) p.v = u.adam_v.span().subspan(job.range.begin, n);
    if (job.arrays & kParams) p.params = u.params.at(u.params_opt + job.range.begin);
    f(p);
  }
}

}  // namespace zerodp
