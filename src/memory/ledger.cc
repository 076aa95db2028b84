#include "memory/ledger.h"

#include <algorithm>
#include <cstring>
#include <new>

#include <fmt/core.h>

#include "core/error.h"
#include "core/units.h"

namespace zerodp {

std::string_view mem_category_name(MemCategory c) {
  static constexpr std::string_view kNames[kNumMemCategories] = {
      "params",       "grads",        "master",          "adam_m",      "adam_v",
      "gathered",     "grad_buckets", "grad_accum",      "hpz_params",  "activations",
      "comm_buffers", "workspace",    "offload_staging", "outer_state", "checkpoint_staging"};
  return kNames[static_cast<int>(c)];
}

void MemoryLedger::reserve(MemCategory c, uint64_t bytes) {
  const uint64_t total = current_total_ + bytes;
  if (budget_ && total > *budget_) {
    std::string held;
    for (int k = 0; k < kNumMemCategories; ++k) {
      if (current_[k] == 0) continue;
      held += fmt::format("{}{} {}", held.empty() ? "" : ", ",
                          mem_category_name(static_cast<MemCategory>(k)),
                          format_bytes(static_cast<double>(current_[k])));
    }
    throw OutOfMemory(fmt::format(
        "rank {}: allocating {} of {} would hold {} in all, over the --memory-per-rank budget of "
        "{} (held: {}){}{}",
        rank_, format_bytes(static_cast<double>(bytes)), mem_category_name(c),
        format_bytes(static_cast<double>(total)), format_bytes(static_cast<double>(*budget_)),
        held.empty() ? "nothing" : held, advice_.empty() ? "" : "; ", advice_));
  }
  const int k = static_cast<int>(c);
  current_[k] += bytes;
  peak_[k] = std::max(peak_[k], current_[k]);
  current_total_ = total;
  peak_total_ = std::max(peak_total_, current_total_);
}

void MemoryLedger::release(MemCategory c, uint64_t bytes) {
  const int k = static_cast<int>(c);
  // Releasing more than is held is a bug in the caller, not a user error.
  current_[k] -= std::min(bytes, current_[k]);
  current_total_ -= std::min(bytes, current_total_);
}

void MemoryLedger::reset_peaks() {
  peak_ = current_;
  peak_total_ = current_total_;
}

namespace detail {

constexpr std::align_val_t kAlignment{64};

void* allocate_zeroed(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = ::operator new(bytes, kAlignment);
  std::memset(p, 0, bytes);
  return p;
}

void deallocate(void* p) noexcept {
  if (p != nullptr) ::operator delete(p, kAlignment);
}

}  // namespace detail
}  // namespace zerodp
