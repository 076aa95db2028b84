// offload.h is the contract.
#include "train/offload.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <stdexcept>

#include <unistd.h>

#include <fmt/core.h>

#include "models/init.h"
#include "train/plan.h"

namespace zerodp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kBlockElements = kOffloadAlign / 4;

uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

// Each unit's first byte in the file, and the file's size last.
std::vector<uint64_t> unit_bases(const ShardedState& state) {
  const uint64_t arrays = state.fp32() ? 2 : 3;
  std::vector<uint64_t> base{0};
  for (const UnitState& u : state.units()) {
    base.push_back(base.back() + arrays * offload_region_bytes(u.opt_range.count()));
  }
  return base;
}

}  // namespace

OffloadTier::OffloadTier(ShardedState& state, const std::filesystem::path& dir, int rank,
                         uint64_t piece, MemoryLedger& ledger)
    : state_(state),
      fp32_(state.fp32()),
      piece_(piece),
      unit_base_(unit_bases(state)),
      file_(dir, fmt::format("zerodp-offload-{}-rank{}", ::getpid(), rank), unit_base_.back(),
            /*direct=*/true) {
  if (piece_ == 0 || piece_ % kBlockElements != 0) {
    throw std::logic_error(fmt::format("offload: piece of {} elements is not whole {}-byte blocks",
                                       piece_, kOffloadAlign));
  }
  const uint64_t slot_bytes = static_cast<uint64_t>(arrays_in_file()) * piece_ * 4;
  staging_ =
      Buffer<std::byte>(ledger, MemCategory::kOffloadStaging, 2 * slot_bytes + kOffloadAlign);
  const auto at = reinterpret_cast<uintptr_t>(staging_.data());
  aligned_ = staging_.data() + (round_up(at, kOffloadAlign) - at);
  ledger.add_disk(file_.size());
}

std::span<float> OffloadTier::slot(int s, int array) {
  const size_t index = static_cast<size_t>(s * arrays_in_file() + array);
  return {reinterpret_cast<float*>(aligned_) + index * piece_, piece_};
}

uint64_t OffloadTier::offset(size_t u, int array, size_t e) const {
  const uint64_t region = offload_region_bytes(state_.units()[u].opt_range.count());
  return unit_base_[u] + static_cast<uint64_t>(array) * region + e * 4;
}

void OffloadTier::initialize(uint64_t seed) {
  if (fp32_) return;  // the params are the master, initialized in memory
  std::vector<Job> jobs;
  for (size_t i = 0; i < state_.units().size(); ++i) {
    jobs.push_back({i, {0, state_.units()[i].opt_range.count()}, kMaster});
  }
  stream(jobs, Access::kWrite, [&](Piece& p) {
    const UnitState& u = state_.units()[p.unit];
    const size_t b = u.opt_range.begin + p.begin;
    initialize_range(seed, *u.unit, b, b + p.size(), p.master);
  });
}

void OffloadTier::stream(std::span<const Job> jobs, Access access,
                         const std::function<void(Piece&)>& f) {
  const bool reading = access != Access::kWrite;
  const bool writing = access != Access::kRead;
  std::vector<Window> windows;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Job& job = jobs[j];
    const size_t n = state_.units()[job.unit].opt_range.count();
    if (job.range.begin > job.range.end || job.range.end > n) {
      throw std::logic_error(
          fmt::format("offload: job [{}, {}) of unit {} is outside its {} elements",
                      job.range.begin, job.range.end, job.unit, n));
    }
    for (size_t a = job.range.begin / kBlockElements * kBlockElements; a < job.range.end;
         a += piece_) {
      const Window w{.job = j,
                     .io_begin = a,
                     .io_end = std::min<size_t>(a + piece_, n),
                     .use_begin = std::max(a, job.range.begin),
                     .use_end = std::min<size_t>(a + piece_, job.range.end)};
      // Writing part of a window without reading it would write the rest as garbage.
      if (!reading && (w.use_begin != w.io_begin || w.use_end != w.io_end)) {
        throw std::logic_error("offload: a write-only job must cover whole windows");
      }
      windows.push_back(w);
    }
  }

  // The file's arrays a job moves, as indices into the file's regions and a slot's arrays.
  const auto file_arrays = [&](unsigned arrays) {
    std::vector<int> out;
    if (!fp32_ && (arrays & kMaster)) out.push_back(0);
    if (arrays & kAdamM) out.push_back(fp32_ ? 0 : 1);
    if (arrays & kAdamV) out.push_back(fp32_ ? 1 : 2);
    return out;
  };
  const auto issue = [&](size_t k, bool write) {
    const Window& w = windows[k];
    const Job& job = jobs[w.job];
    const uint64_t bytes = round_up((w.io_end - w.io_begin) * 4, kOffloadAlign);
    std::vector<IoWork> works;
    for (int a : file_arrays(job.arrays)) {
      std::byte* buf = reinterpret_cast<std::byte*>(slot(static_cast<int>(k % 2), a).data());
      const uint64_t at = offset(job.unit, a, w.io_begin);
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
    Piece p{.job = w.job,
            .unit = job.unit,
            .begin = w.use_begin,
            .first = k == 0 || windows[k - 1].job != w.job,
            .last = k + 1 == windows.size() || windows[k + 1].job != w.job,
            .master = {},
            .m = {},
            .v = {}};
    const size_t skip = w.use_begin - w.io_begin, len = w.use_end - w.use_begin;
    const auto view = [&](int a) { return slot(static_cast<int>(s), a).subspan(skip, len); };
    if (job.arrays & kMaster) {
      if (fp32_) {
        UnitState& u = state_.units()[job.unit];
        p.master = {static_cast<float*>(u.params.data()) + u.params_opt + w.use_begin, len};
      } else {
        p.master = view(0);
      }
    }
    if (job.arrays & kAdamM) p.m = view(fp32_ ? 0 : 1);
    if (job.arrays & kAdamV) p.v = view(fp32_ ? 1 : 2);
    f(p);
    if (writing) writes[s] = issue(k, true);
  }
  wait(writes[0]);
  wait(writes[1]);
}

}  // namespace zerodp
