// The `local` backend: N ranks as threads of one process, over shared memory.
//
// Collectives read peers' buffers directly (no staging copies): in a reduce-scatter rank r
// reads range r of every rank's input and writes its own output; in an all-gather it copies
// every peer's shard into its own output. Ranks meet at barriers that spin briefly, then
// sleep, and give up at the timeout or as soon as any rank aborts.
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"

namespace zerodp {

class LocalWorld {
 public:
  LocalWorld(int world_size, const CommOptions& options = {});
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const;
  // Rank r's communicator; use it from one thread only.
  Communicator& comm(int rank);
  // The rank named by the first abort, or -1 while no rank has failed.
  int failed_rank() const;

  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

// Throws InvalidArgument when the machine would refuse `world_size` more threads (kernel
// thread, pid and memory-map limits, the user's process limit, less what already runs):
// run_local checks it before starting any, callers with work to do first may check earlier.
void check_startable_threads(int world_size);

// Runs fn(rank's communicator) on `world_size` threads and joins them. If a rank throws,
// the world is aborted so every other rank's collectives fail naming it, and once all
// threads have ended the first failure (the root cause) is rethrown.
void run_local(int world_size, const CommOptions& options,
               const std::function<void(Communicator&)>& fn);

}  // namespace zerodp
