// The offload tier (--offload optimizer, docs/offload.md): a rank's optimizer states (fp32
// master, adam_m, adam_v of every unit's optimizer range) kept in a scratch file instead of
// memory, and streamed through two staging slots: while the caller computes on one piece,
// the file's worker writes the previous piece back and reads the next one in.
//
// File layout, per unit in model order: a region for master (16-bit runs only: at fp32 the
// params are the master and stay in memory), then adam_m, then adam_v, each of the unit's
// optimizer range, padded to whole kOffloadAlign blocks (train/plan.h). A piece is an
// aligned window of kOffloadPiece elements (fewer for small units) of one unit, so every
// read and write is aligned for O_DIRECT.
//
// The values streamed are the values an in-memory run holds, byte for byte: the tier moves
// bits, it never converts them, so an offloaded run is bit-identical to the same run without.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "core/partition.h"
#include "memory/ledger.h"
#include "memory/state_file.h"
#include "train/sharded_state.h"

namespace zerodp {

class OffloadTier {
 public:
  // Which arrays a job streams (a bit set).
  enum Arrays : unsigned { kMaster = 1, kAdamM = 2, kAdamV = 4, kAll = 7 };
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
  };
  struct Piece {
    size_t job = 0;
    size_t unit = 0;
    size_t begin = 0;    // in the unit's optimizer range
    bool first = false;  // the job's first piece
    bool last = false;   // the job's last piece
    // The arrays the job asked for, [begin, begin + size) of each; empty otherwise. At fp32,
    // master is the params' own memory.
    std::span<float> master, m, v;
    size_t size() const { return master.empty() ? m.size() : master.size(); }
  };

  // Creates rank `rank`'s file under `dir` for `state`'s units, sized as
  // model_state_bytes(..., offload) says, with the staging slots on `ledger` (offload_staging)
  // and the file's bytes noted as its disk bytes. `piece`: elements per staged window
  // (TransientLayout::offload_piece). Throws as StateFile does when the directory cannot
  // hold the file.
  OffloadTier(ShardedState& state, const std::filesystem::path& dir, int rank, uint64_t piece,
              MemoryLedger& ledger);

  // Writes the starting master weights (the pure init function's values of every optimizer
  // range); the moments start at zero, which the reserved file reads as.
  void initialize(uint64_t seed);

  // Streams the jobs' pieces in order, calling f on each. Reads run one piece ahead of f,
  // writes behind it. Returns when every write is on disk (in the page cache without
  // O_DIRECT); rethrows the first I/O error, naming the file and offset.
  void stream(std::span<const Job> jobs, Access access, const std::function<void(Piece&)>& f);

  const StateFile& file() const { return file_; }
  uint64_t piece_elements() const { return piece_; }
  // What the tier has moved and how long the caller waited for it, since the start.
  struct Counters {
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
    double wait_seconds = 0;  // waiting for reads and for the last writes
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Window {
    size_t job = 0;
    size_t io_begin = 0, io_end = 0;    // the aligned window read or written
    size_t use_begin = 0, use_end = 0;  // the part the caller sees
  };
  std::span<float> slot(int s, int array);
  // The file offset of `array` (0 master, 1 adam_m, 2 adam_v) of unit u at element e.
  uint64_t offset(size_t u, int array, size_t e) const;
  int arrays_in_file() const { return fp32_ ? 2 : 3; }

  ShardedState& state_;
  bool fp32_;
  uint64_t piece_;
  std::vector<uint64_t> unit_base_;  // each unit's first byte in the file
  StateFile file_;
  Buffer<std::byte> staging_;
  std::byte* aligned_ = nullptr;  // staging_, aligned to StateFile::kDirectAlign
  Counters counters_;
};

}  // namespace zerodp
