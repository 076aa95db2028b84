// The offload tier (--offload, docs/offload.md): a rank's optimizer states (fp32 master,
// adam_m, adam_v of every unit's optimizer range) and, with optimizer,params at stage 3, its
// parameter shards, kept in a scratch file instead of memory and streamed through two
// staging slots: while the caller computes on one piece, the file's worker writes the
// previous piece back and reads the next one in.
//
// File layout, per unit in model order, one region per array of the unit's optimizer range
// (at stage 3 that is the parameter shard), each padded to whole kOffloadAlign blocks: the
// unit's state layout's entries in the file (train/state_layout.h), in its order, so the file
// is what the planner sums. They are the 16-bit parameters (optimizer,params only), master
// (16-bit runs; at fp32 the parameters are the master, so it is there only when they are
// offloaded), adam_m, adam_v. With --optimizer-states int8 the moments' regions hold their
// codes, a byte per element (0 at elements of the tensors whose moments stay fp32); the block
// scales and those small tensors' fp32 moments are a few percent of the codes and stay in
// memory. A piece is
// an aligned window of kOffloadPiece elements (fewer for small units) of one unit, a whole
// number of blocks in every region, so every read and write is aligned for O_DIRECT.
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
#include "train/state_layout.h"
#include "train/state_store.h"

namespace zerodp {

class OffloadTier final : public StateStore {
 public:
  // Creates rank `rank`'s file under `dir` for `state`'s units, sized as
  // model_state_bytes(..., offload) says, with the staging slots on `ledger` (offload_staging)
  // and the file's bytes noted as its disk bytes. `piece`: elements per staged window
  // (TransientLayout::offload_piece). Throws as StateFile does when the directory cannot
  // hold the file. Islands in turn (RankTrainer): island `island`'s tier streams through
  // `staging_of`'s staging (island 0's), as no two islands' streams ever run at once.
  OffloadTier(ShardedState& state, Offload offload, const std::filesystem::path& dir, int rank,
              uint64_t piece, MemoryLedger& ledger, int island = 0,
              OffloadTier* staging_of = nullptr);

  // Writes the starting master weights (and parameters) as the pure init function gives
  // them for every optimizer range; the moments start at zero, which the reserved file reads
  // as.
  void initialize(uint64_t seed);

  bool holds_params() const { return params_; }
  // A read queued on the file's worker.
  struct PendingRead {
    std::vector<IoWork> works;
  };
  // Queues the read of unit u's parameter shard (its optimizer range, in the state's dtype)
  // into `into` and returns at once: the file's worker reads it piece by piece through one
  // bounce piece and copies each into place, so the caller computes meanwhile. `into` must
  // stay alive and untouched until finish(); reads finish in the order they were queued.
  PendingRead read_params_async(size_t u, void* into);
  // Waits for the read (counted in wait_seconds); rethrows its first error. Every read must
  // be finished before the tier is destroyed.
  void finish(PendingRead& read);

  // Streams the jobs' pieces in order, calling f on each. Reads run one piece ahead of f,
  // writes behind it. Returns when every write is on disk (in the page cache without
  // O_DIRECT); rethrows the first I/O error, naming the file and offset.
  void stream(std::span<const Job> jobs, Access access,
              const std::function<void(Piece&)>& f) override;

  // --checkpoint-async's hook: called with a unit's index on the streaming thread before a
  // writing stream changes any of that unit's arrays (in the file or the params' memory); a
  // save still reading the unit's old values (read_out) waits there. Set while no stream runs.
  void set_before_write(std::function<void(size_t unit)> f) { before_write_ = std::move(f); }
  // Elements [begin, begin + count) of unit `unit`'s optimizer range of one array (kParams,
  // kMaster, kAdamM or kAdamV), handed to `sink` in order, without staging them whole: from
  // the file through `bounce` (kOffloadAlign-aligned, whole blocks), each read queued on the
  // file's worker in order with the streams' I/O, or straight from the params' memory. Any
  // thread; the caller keeps the streams from writing those elements meanwhile. Its reads are
  // not in counters().
  void read_out(size_t unit, unsigned array, size_t begin, size_t count,
                std::span<std::byte> bounce,
                const std::function<void(std::span<const std::byte>)>& sink);

  const StateFile& file() const { return file_; }
  uint64_t piece_elements() const { return piece_; }
  // What the tier has moved and how long the caller waited for it, since the start.
  struct Counters {
    uint64_t bytes_read = 0;
    uint64_t bytes_written = 0;
    double wait_seconds = 0;  // waiting for reads and for the last writes
    // Of those, the updates' (bytes read + written) and their wall time: the rate the disk
    // gives this tier, the figure to price it by (estimate --disk-bandwidth).
    uint64_t update_bytes = 0;
    double update_seconds = 0;
    Counters& operator+=(const Counters& o) {
      bytes_read += o.bytes_read;
      bytes_written += o.bytes_written;
      wait_seconds += o.wait_seconds;
      update_bytes += o.update_bytes;
      update_seconds += o.update_seconds;
      return *this;
    }
  };
  const Counters& counters() const { return counters_; }
  uint64_t bytes_moved() const override { return counters_.bytes_read + counters_.bytes_written; }
  void count_update(uint64_t bytes, double seconds) override {
    counters_.update_bytes += bytes;
    counters_.update_seconds += seconds;
  }

 private:
  struct Window {
    size_t job = 0;
    size_t io_begin = 0, io_end = 0;    // the aligned window read or written
    size_t use_begin = 0, use_end = 0;  // the part the caller sees
  };
  // One array's region in every unit: the layout entry it keeps, which Arrays bits it serves
  // and its element size.
  struct Region {
    StateEntry entry = StateEntry::kParams;
    unsigned arrays = 0;
    uint64_t element_bytes = 4;
  };
  // The layout's entries in the file (UnitState::layout), in its order; logic_error for one
  // a Piece cannot carry, or where the parameters are in the file and `params` says not.
  static std::vector<Region> regions_of(const ShardedState& state, bool params);
  // Each unit's first byte in the file, then the file's size; logic_error where a unit's
  // layout does not fill `regions` with one element per element of its optimizer range.
  static std::vector<uint64_t> unit_bases(const ShardedState& state,
                                          const std::vector<Region>& regions);
  // The aligned windows a stream of `jobs` reads and writes, in order (logic_error for a job
  // outside its unit, or a write that would leave part of a window unread).
  std::vector<Window> windows_of(std::span<const Job> jobs, bool reading, bool writing) const;
  // Region r of staging slot s.
  std::byte* slot(int s, size_t r);
  // Points piece `p` (its unit, begin and count set) at the `arrays` it asked for: slot `s`'s
  // regions from element `skip` of the window, or the params' memory.
  void point_piece(Piece& p, unsigned arrays, int s, size_t skip);
  // The file offset of region r of unit u at element e.
  uint64_t offset(size_t u, size_t r, size_t e) const;

  ShardedState& state_;
  bool params_;
  std::vector<Region> regions_;
  uint64_t piece_;
  uint64_t block_;                   // elements per kOffloadAlign block of the narrowest region
  uint64_t slot_bytes_;              // one staging slot: a piece of every region
  std::vector<uint64_t> unit_base_;  // each unit's first byte in the file
  StateFile file_;
  Buffer<std::byte> staging_;
  std::byte* aligned_ = nullptr;  // staging_, aligned to StateFile::kDirectAlign
  std::byte* bounce_ = nullptr;   // after the two slots: one piece of parameters
  Counters counters_;
  std::function<void(size_t)> before_write_;
};

}  // namespace zerodp
