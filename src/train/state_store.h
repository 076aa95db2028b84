// Where a rank's optimizer states (and, offloaded at stage 3, its parameter shards) live,
// as one interface: a StateStore streams the arrays of a unit's optimizer range to a
// callback in pieces. In memory (MemoryStore) a job is one piece pointing at the buffers
// themselves (one per tensor for 8-bit moments' codes); offloaded (OffloadTier,
// train/offload.h) it is many, staged through the file. Both hand out the same values in the
// same shapes, so code that reads or writes whole states (checkpoints, the weights' hash, the
// optimizer's update, --init-from) streams from the store and never asks where they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "core/partition.h"
#include "train/sharded_state.h"

namespace zerodp {

class StateStore {
 public:
  // Which arrays a job streams (a bit set). kParams: the parameters in their dtype, wherever
  // they are: the file's region (at fp32 the same as kMaster's) when the tier holds them, else
  // their own memory, which moves no bytes.
  enum Arrays : unsigned { kMaster = 1, kAdamM = 2, kAdamV = 4, kAll = 7, kParams = 8 };
  enum class Access {
    kRead,       // pieces are read in; what the callback changes is dropped
    kWrite,      // pieces start undefined and are written out (jobs must cover whole windows)
    kReadWrite,  // read in, changed by the callback, written back
  };
  // Elements [range.begin, range.end) of unit `unit`'s optimizer range.
  struct Job {
    size_t unit = 0;
    Range range;
    unsigned arrays = kAll;
    // Of `arrays`, those not read in before the callback (it overwrites them) under kReadWrite;
    // the job must then cover whole windows.
    unsigned write_only = 0;
  };
  struct Piece {
    size_t job = 0;
    size_t unit = 0;
    size_t begin = 0;    // in the unit's optimizer range
    bool first = false;  // the job's first piece
    bool last = false;   // the job's last piece
    size_t count = 0;
    // The arrays the job asked for, [begin, begin + count) of each; empty otherwise. Arrays the
    // file does not hold (kParams in memory; kMaster at fp32, which is the params) point into
    // the params' own memory.
    std::span<float> master, m, v;
    // 8-bit moments: kAdamM and kAdamV are their codes, one byte per element of the
    // optimizer range, 0 at elements of tensors whose moments stay fp32 (what is written
    // there is dropped); those tensors' moments and the block scales stay in the unit's
    // memory (UnitState::quantized, moments_io.h), offloaded or not.
    std::span<uint8_t> m8, v8;
    void* params = nullptr;  // count elements of the state's dtype
    size_t size() const { return count; }
  };

  virtual ~StateStore() = default;
  // Streams the jobs' pieces in order, calling f on each; returns when what f wrote is
  // stored. Rethrows the first I/O error.
  virtual void stream(std::span<const Job> jobs, Access access,
                      const std::function<void(Piece&)>& f) = 0;
  // Bytes read and written so far (none in memory).
  virtual uint64_t bytes_moved() const { return 0; }
  // Records that one optimizer update streamed `bytes` (read + written) in `seconds`.
  virtual void count_update(uint64_t /*bytes*/, double /*seconds*/) {}
};

// The states in memory: each job is one piece over the unit's own buffers, so a callback
// reads and writes them in place and Access changes nothing. 8-bit codes are held only for
// the quantized tensors, so a job asking for them comes as one piece per tensor of its
// range: a quantized one's points at its codes, another's at zeros of its own.
class MemoryStore final : public StateStore {
 public:
  explicit MemoryStore(ShardedState& state) : state_(state) {}
  void stream(std::span<const Job> jobs, Access access,
              const std::function<void(Piece&)>& f) override;

 private:
  ShardedState& state_;
};

}  // namespace zerodp
