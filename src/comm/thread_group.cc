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
      entered_(static_cast<size_t>(members)),
      reading_(static_cast<size_t>(members)) {}

void ThreadGroup::abort(int rank, const std::string& reason) {
  {
    MutexLock lock(mu_);
    if (!record_failure(rank, reason)) return;
  }
  cv_.notify_all();
}

bool ThreadGroup::record_failure(int rank, const std::string& reason) {
  if (aborted_.load()) return false;
  failed_rank_ = rank;
  failure_ = reason;
  aborted_.store(true, std::memory_order_release);
  return true;
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

void ThreadGroup::stop_reading(int member) {
  reading_[member].store(false, std::memory_order_release);
  if (aborted()) {
    // Through the lock, so a member that just found this one reading is asleep by now.
    { MutexLock lock(mu_); }
    cv_.notify_all();
  }
}

void ThreadGroup::leave(int member) { stop_reading(member); }

void ThreadGroup::wait_for_readers(int member) {
  stop_reading(member);
  const auto none_reading = [&] {
    for (int m = 0; m < members_; ++m) {
      if (m != member && reading_[m].load(std::memory_order_acquire)) return false;
    }
    return true;
  };
  if (none_reading()) return;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_seconds_));
  MutexLock lock(mu_);
  cv_.wait_until(mu_, deadline, none_reading);
}

// A barrier completes only under the lock and only while the group stands, and a member
// leaves by failure only after seeing, under the lock, that its barrier did not complete:
// so no member reads the buffers of one that left. A member is marked reading from its
// arrival (before the barrier can complete) to its next arrival.
void ThreadGroup::arrive_and_wait(int member, const std::string& what, bool reads_after) {
  if (aborted()) {
    wait_for_readers(member);
    throw_aborted();
  }
  // Release: a peer that sees this member done reading may free what it read.
  reading_[member].store(reads_after, std::memory_order_release);
  const uint64_t my_entry = entered_[member].fetch_add(1, std::memory_order_relaxed) + 1;
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == members_) {
    arrived_.store(0, std::memory_order_relaxed);
    bool completed = false;
    {
      MutexLock lock(mu_);
      if (!aborted_.load()) {
        generation_.store(gen + 1, std::memory_order_release);
        completed = true;
      }
    }
    if (!completed) {
      wait_for_readers(member);
      throw_aborted();
    }
    cv_.notify_all();
    return;
  }
  for (unsigned i = 0; i < spin_limit_; ++i) {
    if (generation_.load(std::memory_order_acquire) != gen) return;
    if (aborted_.load(std::memory_order_relaxed)) break;
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
    if (!woken) {
      std::vector<int> missing;
      for (int m = 0; m < members_; ++m) {
        if (entered_[m].load(std::memory_order_relaxed) < my_entry)
          missing.push_back(first_rank_ + m);
      }
      reason = fmt::format("{} timed out after {:g} s on rank {} waiting for rank(s) {}", what,
                           timeout_seconds_, first_rank_ + member, fmt::join(missing, ", "));
      late = missing.empty() ? -1 : missing.front();
      // Recorded before the lock is let go, so no late arrival completes this barrier.
      record_failure(late, reason);
    }
  }
  cv_.notify_all();
  wait_for_readers(member);
  if (reason.empty()) throw_aborted();
  throw CommTimeout(reason, late);
}

}  // namespace zerodp
