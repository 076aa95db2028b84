// Faults injected on purpose (--inject KIND@STEP[:RANK]; docs/reliability.md), for tests and
// demos of failure handling. The step meets the plan at named hook points, and only there:
//   step_start        kill (SIGKILL), term (a stop request, as SIGTERM to this rank alone),
//                     throw, oom (std::bad_alloc), hang (sleep past the collective timeout)
//   gradients_reduced nan: one element of this rank's owned gradient becomes NaN
//   shard_write       io: the checkpoint shard cannot be written; slowio: its write takes
//                     kSlowWriteSeconds longer (a slow disk)
//   commit            commitio: the commit fails; slowcommit: it takes kSlowWriteSeconds longer
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "train/config.h"
#include "train/sharded_state.h"

namespace zerodp {

class FaultPlan {
 public:
  // The injections aimed at `rank`; `timeout_seconds` is the collective timeout a hang
  // outlasts.
  FaultPlan(std::span<const Injection> injections, int rank, double timeout_seconds);

  void step_start(int64_t step) const;
  void gradients_reduced(int64_t step, ShardedState& state) const;
  // Throws IoError naming `file`, or sleeps kSlowWriteSeconds.
  static constexpr double kSlowWriteSeconds = 2;
  void shard_write(int64_t step, const std::filesystem::path& file) const;
  // The slowio delay of step `step`'s shard write (0 when none), for a writer that waits
  // it out on its own terms (an abandoned background write stops waiting).
  double shard_write_delay(int64_t step) const;
  // shard_write's failure alone.
  void shard_write_failure(int64_t step, const std::filesystem::path& file) const;
  // The commit of step `step`'s checkpoint into `dir`: sleeps kSlowWriteSeconds, or throws
  // IoError naming `dir`.
  void commit(int64_t step, const std::filesystem::path& dir) const;

 private:
  bool at(Injection::Kind kind, int64_t step) const;

  std::vector<Injection> mine_;
  int rank_;
  double timeout_seconds_;
};

}  // namespace zerodp
