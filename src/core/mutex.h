// A mutex clang's thread-safety analysis can check (`make thread-safety`). libstdc++'s
// std::mutex carries no capability attributes, so data annotated GUARDED_BY a std::mutex is
// never checked; these wrappers are std::mutex and std::condition_variable underneath, inline,
// with nothing added at run time. The annotations are core/thread_annotations.h's (re-exported
// here); under GCC they expand to nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "core/thread_annotations.h"

namespace zerodp {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }
  // For CondVar, which waits on the std::mutex underneath.
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope (std::lock_guard, annotated).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// A condition variable whose waits take the Mutex the caller holds: the wait releases and
// retakes it, so to the analysis the caller holds it throughout, as it does around the call.
//
// Waits take no predicate reading guarded data: the analysis checks a lambda apart from its
// caller, so callers loop (`while (!ready) cv.wait(mu);`) where the reads are checked.
class CondVar {
 public:
  void wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  template <typename Predicate>
  void wait(Mutex& mu, Predicate ready) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    cv_.wait(lock, ready);
    lock.release();
  }
  // False when `ready` is still false at the deadline.
  template <typename Clock, typename Duration, typename Predicate>
  bool wait_until(Mutex& mu, const std::chrono::time_point<Clock, Duration>& deadline,
                  Predicate ready) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    const bool ok = cv_.wait_until(lock, deadline, ready);
    lock.release();
    return ok;
  }
  template <typename Rep, typename Period, typename Predicate>
  bool wait_for(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout, Predicate ready)
      REQUIRES(mu) {
    return wait_until(mu, std::chrono::steady_clock::now() + timeout, ready);
  }
  // At most `timeout`; the caller rechecks what it waits for.
  template <typename Rep, typename Period>
  void wait_for(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.native(), std::adopt_lock);
    cv_.wait_for(lock, timeout);
    lock.release();
  }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace zerodp
