#include "comm/thread_group.h"

#include <algorithm>
#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/sysinfo.h"

namespace zerodp {
namespace {

using Clock = std::chrono::steady_clock;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

ThreadGroup::ThreadGroup(int members, int first_rank, double timeout_seconds)
    : members_(members),
      first_rank_(first_rank),
      timeout_seconds_(timeout_seconds),
      spin_limit_(members <= usable_cores() ? 20000 : 200),
      entered_(static_cast<size_t>(members)) {}

void ThreadGroup::abort(int rank, const std::string& reason) {
  {
    MutexLock lock(mu_);
    if (aborted_.load()) return;
    failed_rank_ = rank;
    failure_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

int ThreadGroup::failed_rank() const {
  MutexLock lock(mu_);
  return failed_rank_;
}

std::string ThreadGroup::failure() const {
  MutexLock lock(mu_);
  return failure_;
}

void ThreadGroup::throw_aborted() const {
  MutexLock lock(mu_);
  throw CommError(fmt::format("rank {} failed: {}", failed_rank_, failure_), failed_rank_);
}

void ThreadGroup::arrive_and_wait(int member, const std::string& what) {
  if (aborted()) throw_aborted();
  const uint64_t my_entry = entered_[member].fetch_add(1, std::memory_order_relaxed) + 1;
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == members_) {
    arrived_.store(0, std::memory_order_relaxed);
    {
      MutexLock lock(mu_);
      generation_.store(gen + 1, std::memory_order_release);
    }
    cv_.notify_all();
    return;
  }
  for (unsigned i = 0; i < spin_limit_; ++i) {
    if (generation_.load(std::memory_order_acquire) != gen) return;
    if (aborted_.load(std::memory_order_relaxed)) throw_aborted();
    cpu_relax();
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_seconds_));
  std::string reason;
  int late = -1;
  {
    MutexLock lock(mu_);
    const bool woken = cv_.wait_until(mu_, deadline, [&] {
      return generation_.load(std::memory_order_acquire) != gen || aborted_.load();
    });
    if (generation_.load(std::memory_order_acquire) != gen) return;
    if (woken) {
      reason.clear();  // aborted: thrown below, outside the lock throw_aborted takes
    } else {
      std::vector<int> missing;
      for (int m = 0; m < members_; ++m) {
        if (entered_[m].load(std::memory_order_relaxed) < my_entry)
          missing.push_back(first_rank_ + m);
      }
      reason = fmt::format("{} timed out after {:g} s on rank {} waiting for rank(s) {}", what,
                           timeout_seconds_, first_rank_ + member, fmt::join(missing, ", "));
      late = missing.empty() ? -1 : missing.front();
    }
  }
  if (reason.empty()) throw_aborted();
  abort(late, reason);
  throw CommTimeout(reason, late);
}

}  // namespace zerodp
