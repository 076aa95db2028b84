// The meeting point of ranks that are threads of one process (the local backend's world, or
// the ranks an MPI process hosts): an abort record and a barrier. The barrier spins
// briefly, then sleeps; it fails as soon as any member aborts, and at the timeout it
// aborts the group itself, naming the ranks that did not arrive.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/mutex.h"

namespace zerodp {

class ThreadGroup {
 public:
  // Members 0..members-1 are ranks first_rank.. of the world (for messages only).
  ThreadGroup(int members, int first_rank, double timeout_seconds);
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int members() const { return members_; }
  // Waits until every member has arrived. `what` names the collective for error messages.
  // Throws CommError once the group is aborted, CommTimeout (after aborting the group)
  // when a member is later than the timeout.
  void arrive_and_wait(int member, const std::string& what) EXCLUDES(mu_);

  // Records the first failure: `rank` (of the world; -1 when unknown) and its reason. Later
  // calls change nothing.
  void abort(int rank, const std::string& reason) EXCLUDES(mu_);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // The flag itself, for waits that poll it (MPI requests).
  const std::atomic<bool>& aborted_flag() const { return aborted_; }
  // The abort record: the rank it names (-1 while none failed) and its reason.
  int failed_rank() const EXCLUDES(mu_);
  std::string failure() const EXCLUDES(mu_);
  // Throws CommError "rank R failed: reason" from the abort record.
  [[noreturn]] void throw_aborted() const EXCLUDES(mu_);

 private:
  const int members_;
  const int first_rank_;
  const double timeout_seconds_;
  // Spinning only pays while every member has a core; oversubscribed ones must sleep soon.
  const unsigned spin_limit_;

  // Members count in; the last one bumps the generation.
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
  std::vector<std::atomic<uint64_t>> entered_;  // barriers each member entered, for diagnosis

  std::atomic<bool> aborted_{false};
  mutable Mutex mu_;  // guards the fields below and the sleeping side of the barrier
  CondVar cv_;
  int failed_rank_ GUARDED_BY(mu_) = -1;
  std::string failure_ GUARDED_BY(mu_);
};

}  // namespace zerodp
