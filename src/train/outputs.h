// What a training run writes, checked before its first step: a run must not train for
// hours and then fail at its end because a report cannot be written, nor destroy one of
// its own inputs, nor share a checkpoint directory with another live run.
#pragma once

#include <filesystem>
#include <span>

#include "core/files.h"
#include "train/config.h"

namespace zerodp {

// Refuses (InvalidArgument) an output that is the same file as an input (--data,
// --resume, and `extra_inputs` such as the --config file) or another output (--report,
// --metrics, --trace), then probes each output location and the --checkpoint-dir (created
// if missing), naming the flag when one cannot be written.
void check_outputs(const TrainConfig& cfg, std::span<const files::Named> extra_inputs = {});

// An exclusive lock (flock) on DIR/.lock for as long as the run lives, holding the owner's
// pid and host: two runs committing into one directory would remove each other's
// temporaries and race on `latest`. The kernel drops the lock when the process dies, so a
// killed run never leaves it stale. An empty dir holds nothing.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::filesystem::path& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace zerodp
