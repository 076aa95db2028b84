// Elastic restarts (--max-restarts, local backend): which failures of a launch the survivors
// can get past, and the launch they restart with. docs/reliability.md, "Elastic restarts".
#pragma once

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/result.h"

namespace zerodp {

// A local rank's failure inside its step loop, recorded by its own thread and read once
// every thread has ended: the evidence a restart is decided on (--max-restarts).
struct RankFailure {
  bool failed = false;
  int64_t step = 0;
  // Its own failure, not a collective failing because a peer did (CommError).
  bool own = false;
  // A failure of this rank that the survivors, restarted from a checkpoint, can get past:
  // zerodp::Error itself, the type for what no other type describes (the injected throw, a
  // library's exception the step wrapped). Not the typed errors: InvalidArgument, CorruptData
  // (the same input fails again), OutOfMemory (on fewer ranks each holds more), IoError (the
  // disk stays full), Interrupted (the user asked to stop); nor std::bad_alloc (the same),
  // nor any other std::exception (a defect the same step meets again).
  bool restartable = false;
  std::string message;  // as thrown, before the rank and step are put in front
};

// The failure `error` of a rank at `step`, as its own thread records it.
RankFailure failure_of(const std::exception_ptr& error, int64_t step);

// After a local launch ended with `error`: the restart the survivors make, with cfg set
// for their launch; or `error` rethrown: unchanged when it is not a rank's failure a
// restart gets past, with the reason appended when it is but no restart can be made.
Restart plan_restart(TrainConfig& cfg, const std::exception_ptr& error,
                     const std::vector<RankFailure>& failures, std::span<const Restart> done,
                     bool default_policy);

}  // namespace zerodp
