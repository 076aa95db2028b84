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
  // Waits until every member has arrived. `what` names the collective for error messages;
  // `reads_after` says whether the member goes on to read its peers' buffers once all have
  // met.
  // Throws CommError once the group is aborted, CommTimeout (after aborting the group)
  // when a member is later than the timeout. A member that throws first waits (bounded by
  // the timeout) until no peer is still reading, since its caller frees the buffers they
  // read: readers reach their next barrier, or leave(), soon after an abort.
  void arrive_and_wait(int member, const std::string& what, bool reads_after) EXCLUDES(mu_);
  // The member stopped reading its peers' buffers without reaching the next barrier (its
  // collective failed in between).
  void leave(int member) EXCLUDES(mu_);

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
  std::vector<std::atomic<bool>> reading_;      // from a reads_after arrival to the next

  // Sets the abort record unless one is set; says whether it did.
  bool record_failure(int rank, const std::string& reason) REQUIRES(mu_);
  void stop_reading(int member) EXCLUDES(mu_);
  // Before a member leaves by throwing: returns once no other member reads.
  void wait_for_readers(int member) EXCLUDES(mu_);

  std::atomic<bool> aborted_{false};
  mutable Mutex mu_;  // guards the fields below and the sleeping side of the barrier
  CondVar cv_;
  int failed_rank_ GUARDED_BY(mu_) = -1;
  std::string failure_ GUARDED_BY(mu_);
};

}  // namespace zerodp
