// offload.h is the contract.
#include "train/offload.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include <unistd.h>

#include <fmt/core.h>

#include "models/init.h"
#include "train/flat.h"
#include "train/plan.h"

namespace zerodp {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

}  // namespace

std::vector<OffloadTier::Region> OffloadTier::regions_of(const ShardedState& state, bool params) {
  if (state.units().empty()) throw std::logic_error("offload: a tier of no units");
  using E = StateEntry;
  // Every unit's layout has the same entries; unit_bases checks each against these.
  const UnitLayout& l = state.units().front().layout;
  const uint64_t moment = state.int8_moments() ? 1 : 4;
  std::vector<Region> regions;
  unsigned served = 0;
  for (size_t k = 0; k < l.entries.size(); ++k) {
    if (!l.entries[k].in_file) continue;
    const auto e = static_cast<E>(k);
    // What a Piece views each region as (point_piece): the parameters in their dtype (at
    // fp32 the master, which they are), fp32 master, fp32 moments or 8-bit codes.
    Region r{.entry = e};
    uint64_t element = 0;
    if (e == E::kParams) {
      r.arrays = state.fp32() ? kParams | kMaster : kParams;
      element = dtype_size(state.dtype());
    } else if (e == E::kMaster) {
      r.arrays = kMaster;
      element = 4;
    } else if (e == E::kAdamM || e == E::kCodesM || e == E::kAdamV || e == E::kCodesV) {
      r.arrays = e == E::kAdamM || e == E::kCodesM ? kAdamM : kAdamV;
      element = moment;
    }
    r.element_bytes = l.entries[k].bits / 8;
    if (r.arrays == 0 || (served & r.arrays) != 0 || l.entries[k].bits != 8 * element) {
      throw std::logic_error(fmt::format(
          "offload: the state layout puts {} ({} bits an element) in the file, which no "
          "piece of the tier carries",
          kStateEntrySpecs[k].name, l.entries[k].bits));
    }
    served |= r.arrays;
    regions.push_back(r);
  }
  if (regions.empty()) throw std::logic_error("offload: the state layout puts nothing in the file");
  if (((served & kParams) != 0) != params) {
    throw std::logic_error(fmt::format("offload: a tier {} the parameters over states laid out {}",
                                       params ? "with" : "without",
                                       params ? "without them in the file" : "with them in it"));
  }
  return regions;
}

std::vector<uint64_t> OffloadTier::unit_bases(const ShardedState& state,
                                              const std::vector<Region>& regions) {
  std::vector<uint64_t> base{0};
  for (size_t i = 0; i < state.units().size(); ++i) {
    const UnitState& u = state.units()[i];
    uint64_t bytes = 0;
    for (const Region& r : regions) {
      // A window is a range of the optimizer range, the same elements in every region.
      const Holding& h = u.layout[r.entry];
      if (!h.in_file || h.bits != 8 * r.element_bytes || h.count != u.opt_range.count()) {
        throw std::logic_error(fmt::format(
            "offload: unit {}'s {} in the file is {} elements of {} bits, not its optimizer "
            "range's {} of {}",
            i, state_entry_spec(r.entry).name, h.in_file ? h.count : 0, h.bits, u.opt_range.count(),
            8 * r.element_bytes));
      }
      bytes += h.file_bytes();
    }
    LayoutBytes layout;
    layout += u.layout;
    if (layout.file != bytes) {
      throw std::logic_error(
          fmt::format("offload: unit {}'s layout puts {} bytes in the file, its regions {}", i,
                      layout.file, bytes));
    }
    base.push_back(base.back() + bytes);
  }
  return base;
}

OffloadTier::OffloadTier(ShardedState& state, Offload offload, const std::filesystem::path& dir,
                         int rank, uint64_t piece, MemoryLedger& ledger, int island,
                         OffloadTier* staging_of)
    : state_(state),
      params_(offload == Offload::kParams),
      regions_(regions_of(state, params_)),
      piece_(piece),
      // Elements per block of the narrowest region: every piece is whole blocks in each.
      block_(kOffloadAlign / std::min_element(regions_.begin(), regions_.end(),
                                              [](const Region& a, const Region& b) {
                                                return a.element_bytes < b.element_bytes;
                                              })
                                 ->element_bytes),
      slot_bytes_(0),
      unit_base_(unit_bases(state, regions_)),
      file_(dir,
            island == 0
                ? fmt::format("zerodp-offload-{}-rank{}", ::getpid(), rank)
                : fmt::format("zerodp-offload-{}-rank{}-island{}", ::getpid(), rank, island),
            unit_base_.back(),
            /*direct=*/true) {
  if (offload == Offload::kNone) throw std::logic_error("offload: a tier of nothing");
  if (piece_ == 0 || piece_ % block_ != 0) {
    throw std::logic_error(fmt::format("offload: piece of {} elements is not whole {}-byte blocks",
                                       piece_, kOffloadAlign));
  }
  for (const Region& r : regions_) slot_bytes_ += piece_ * r.element_bytes;
  ledger.add_disk(file_.size());
  if (staging_of != nullptr) {
    aligned_ = staging_of->aligned_;
    bounce_ = staging_of->bounce_;
    return;
  }
  const uint64_t bounce = params_ ? piece_ * dtype_size(state.dtype()) : 0;
  staging_ = Buffer<std::byte>(ledger, MemCategory::kOffloadStaging,
                               2 * slot_bytes_ + bounce + kOffloadAlign);
  const auto at = reinterpret_cast<uintptr_t>(staging_.data());
  aligned_ = staging_.data() + (round_up(at, kOffloadAlign) - at);
  bounce_ = aligned_ + 2 * slot_bytes_;
}

std::byte* OffloadTier::slot(int s, size_t r) {
  std::byte* p = aligned_ + static_cast<size_t>(s) * slot_bytes_;
  for (size_t k = 0; k < r; ++k) p += piece_ * regions_[k].element_bytes;
  return p;
}

uint64_t OffloadTier::offset(size_t u, size_t r, size_t e) const {
  const UnitLayout& l = state_.units()[u].layout;
  uint64_t at = unit_base_[u];
  for (size_t k = 0; k < r; ++k) at += l[regions_[k].entry].file_bytes();
  return at + e * regions_[r].element_bytes;
}

void OffloadTier::initialize(uint64_t seed) {
  const bool fp32 = state_.fp32();
  const bool int8 = state_.int8_moments();
  // fp32 moments start as the reserved file reads, zero; 8-bit codes as in memory.
  const unsigned moments = int8 ? kAdamM | kAdamV : 0u;
  // At fp32 the params are the master, initialized in memory unless they are here.
  const unsigned weights = fp32 && !params_ ? 0u : kMaster | kParams;
  if ((weights | moments) == 0) return;
  // The master's values, rounded into the 16-bit parameters too: into the file's region
  // with them offloaded, else into memory (ShardedState left the optimizer range to this).
  std::vector<Job> jobs;
  for (size_t i = 0; i < state_.units().size(); ++i) {
    jobs.push_back({i, {0, state_.units()[i].opt_range.count()}, weights | moments});
  }
  stream(jobs, Access::kWrite, [&](Piece& p) {
    const UnitState& u = state_.units()[p.unit];
    if (weights != 0) {
      const size_t b = u.opt_range.begin + p.begin;
      initialize_range(seed, *u.unit, b, b + p.size(), p.master);
      if (!fp32) narrow(p.master, p.params, state_.dtype(), 0);
    }
    if (int8) fill_codes_of_zero(u, p.begin, p.m8, p.v8);
  });
}

OffloadTier::PendingRead OffloadTier::read_params_async(size_t u, void* into) {
  if (!params_) throw std::logic_error("offload: the parameters are not in the file");
  size_t r = 0;
  while (!(regions_[r].arrays & kParams)) ++r;
  const uint64_t eb = regions_[r].element_bytes;
  const size_t n = state_.units()[u].opt_range.count();
  PendingRead read;
  // One worker runs the queue in order, so each piece is copied out of the bounce piece
  // before the next one is read into it.
  for (size_t a = 0; a < n; a += piece_) {
    const size_t len = std::min<size_t>(piece_, n - a);
    const uint64_t bytes = round_up(len * eb, kOffloadAlign);
    std::byte* dst = static_cast<std::byte*>(into) + a * eb;
    read.works.push_back(
        file_.read_async(offset(u, r, a), std::span(bounce_, bytes),
                         [this, dst, len, eb] { std::memcpy(dst, bounce_, len * eb); }));
    counters_.bytes_read += bytes;
  }
  return read;
}

void OffloadTier::finish(PendingRead& read) {
  const auto t0 = Clock::now();
  for (IoWork& w : read.works) w.wait();
  read.works.clear();
  counters_.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<OffloadTier::Window> OffloadTier::windows_of(std::span<const Job> jobs, bool reading,
                                                         bool writing) const {
  std::vector<Window> windows;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    const size_t n = state_.units()[job.unit].opt_range.count();
    if (job.range.begin > job.range.end || job.range.end > n) {
      throw std::logic_error(
          fmt::format("offload: job [{}, {}) of unit {} is outside its {} elements",
                      job.range.begin, job.range.end, job.unit, n));
    }
    for (size_t a = job.range.begin / block_ * block_; a < job.range.end; a += piece_) {
      const Window w{.job = j,
                     .io_begin = a,
                     .io_end = std::min<size_t>(a + piece_, n),
                     .use_begin = std::max(a, job.range.begin),
                     .use_end = std::min<size_t>(a + piece_, job.range.end)};
      // Writing part of a window without reading it would write the rest as garbage.
      const bool unread = !reading || (writing && job.write_only != 0);
      if (unread && (w.use_begin != w.io_begin || w.use_end != w.io_end)) {
        throw std::logic_error("offload: a write-only job must cover whole windows");
      }
      windows.push_back(w);
    }
  }
  return windows;
}

void OffloadTier::stream(std::span<const Job> jobs, Access access,
                         const std::function<void(Piece&)>& f) {
  const bool reading = access != Access::kWrite;
  const bool writing = access != Access::kRead;
  const std::vector<Window> windows = windows_of(jobs, reading, writing);

  // The file's regions a job's arrays live in.
  const auto regions = [&](unsigned arrays) {
    std::vector<size_t> out;
    for (size_t r = 0; r < regions_.size(); ++r) {
      if (regions_[r].arrays & arrays) out.push_back(r);
    }
    return out;
  };
  const auto issue = [&](size_t k, bool write) {
    const Window& w = windows[k];
    const Job& job = jobs[w.job];
    std::vector<IoWork> works;
    for (size_t r : regions(job.arrays)) {
      if (!write && (regions_[r].arrays & job.write_only)) continue;
      const uint64_t eb = regions_[r].element_bytes;
      const uint64_t bytes = round_up((w.io_end - w.io_begin) * eb, kOffloadAlign);
      std::byte* buf = slot(static_cast<int>(k % 2), r);
      const uint64_t at = offset(job.unit, r, w.io_begin);
      works.push_back(write ? file_.write_async(at, std::span<const std::byte>(buf, bytes))
                            : file_.read_async(at, std::span<std::byte>(buf, bytes)));
      (write ? counters_.bytes_written : counters_.bytes_read) += bytes;
    }
    return works;
  };
  const auto wait = [&](std::vector<IoWork>& works) {
    const auto t0 = Clock::now();
    for (IoWork& w : works) w.wait();
    works.clear();
    counters_.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  };

  std::array<std::vector<IoWork>, 2> reads, writes;
  // Whatever ends the stream, nothing queued may still use the staging when it returns.
  struct Drain {
    std::array<std::vector<IoWork>, 2>* lists[2];
    ~Drain() {
      for (auto* l : lists) {
        for (auto& works : *l) {
          for (IoWork& w : works) {
            try {
              w.wait();
            } catch (...) {  // already failing: the first error is the one reported
            }
          }
        }
      }
    }
  } drain{{&reads, &writes}};

  if (reading && !windows.empty()) reads[0] = issue(0, false);
  for (size_t k = 0; k < windows.size(); ++k) {
    const size_t s = k % 2;
    // The next window's read queues behind the write out of its slot (one worker, in order).
    if (reading && k + 1 < windows.size()) reads[1 - s] = issue(k + 1, false);
    wait(writes[s]);
    wait(reads[s]);
    const Window& w = windows[k];
    const Job& job = jobs[w.job];
    const size_t skip = w.use_begin - w.io_begin, len = w.use_end - w.use_begin;
    Piece p{.job = w.job,
            .unit = job.unit,
            .begin = w.use_begin,
            .first = k == 0 || windows[k - 1].job != w.job,
            .last = k + 1 == windows.size() || windows[k + 1].job != w.job,
            .count = len,
            .master = {},
            .m = {},
            .v = {},
            .m8 = {},
            .v8 = {},
            .params = nullptr};
    point_piece(p, job.arrays, static_cast<int>(s), skip);
    if (writing && p.first && before_write_) before_write_(job.unit);
    f(p);
    if (writing) writes[s] = issue(k, true);
  }
  wait(writes[0]);
  wait(writes[1]);
}

void OffloadTier::point_piece(Piece& p, unsigned arrays, int s, size_t skip) {
  for (size_t r = 0; r < regions_.size(); ++r) {
    const unsigned asked = regions_[r].arrays & arrays;
    if (asked == 0) continue;
    std::byte* at = slot(s, r) + skip * regions_[r].element_bytes;
    const std::span<float> view(reinterpret_cast<float*>(at), p.count);
    const std::span<uint8_t> codes(reinterpret_cast<uint8_t*>(at), p.count);
    const bool int8 = state_.int8_moments();
    if (asked & kMaster) p.master = view;
    if ((asked & kAdamM) && int8) p.m8 = codes;
    if ((asked & kAdamM) && !int8) p.m = view;
    if ((asked & kAdamV) && int8) p.v8 = codes;
    if ((asked & kAdamV) && !int8) p.v = view;
    if (asked & kParams) p.params = at;
  }
  // What the file does not hold lives in the params' memory (at fp32 they are the master).
  UnitState& u = state_.units()[p.unit];
  if ((arrays & kMaster) && p.master.empty()) {
    p.master = {static_cast<float*>(u.params.data()) + u.params_opt + p.begin, p.count};
  }
  if ((arrays & kParams) && p.params == nullptr) p.params = u.params.at(u.params_opt + p.begin);
}

void OffloadTier::read_out(size_t unit, unsigned array, size_t begin, size_t count,
                           std::span<std::byte> bounce,
                           const std::function<void(std::span<const std::byte>)>& sink) {
  size_t r = 0;
  while (r < regions_.size() && (regions_[r].arrays & array) == 0) ++r;
  if (r == regions_.size()) {
    // Not in the file: the parameters in memory (at fp32 also the master).
    UnitState& u = state_.units()[unit];
    const size_t bytes = count * dtype_size(state_.dtype());
    sink(std::span(static_cast<const std::byte*>(u.params.at(u.params_opt + begin)), bytes));
    return;
  }
  if (bounce.size() < kOffloadAlign || bounce.size() % kOffloadAlign != 0 ||
      reinterpret_cast<uintptr_t>(bounce.data()) % kOffloadAlign != 0) {
    throw std::logic_error("offload: read_out's bounce buffer is not whole aligned blocks");
  }
  // Byte range [b0, b1) of the region, read in aligned windows (the region is padded to
  // whole blocks, so the last window stays inside it).
  const uint64_t eb = regions_[r].element_bytes;
  const uint64_t base = offset(unit, r, 0);
  const uint64_t b0 = begin * eb, b1 = (begin + count) * eb;
  for (uint64_t at = b0 / kOffloadAlign * kOffloadAlign; at < b1; at += bounce.size()) {
    const uint64_t bytes = std::min<uint64_t>(bounce.size(), round_up(b1 - at, kOffloadAlign));
    file_.read_async(base + at, bounce.first(bytes)).wait();
    const uint64_t from = std::max(at, b0), to = std::min(at + bytes, b1);
    sink(std::span<const std::byte>(bounce.data() + (from - at), to - from));
  }
}

}  // namespace zerodp
