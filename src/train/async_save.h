// --checkpoint-async: checkpoints written beside the training instead of stalling it.
//
// At a step boundary every rank begins the save as a synchronous one does (the temporary
// directory agreed, meta.json of the step decided: train/checkpoint_io.h's begin_save),
// copies its shard's bytes, in the file's order, into a staging buffer, and hands them to
// its writer thread, which writes and fsyncs the shard file (rank 0 the history too) while
// the steps go on. The staging buffer is allocated once, at the size of the largest shard
// this rank writes (checkpoint_staging in the memory ledger and the planner): at most one
// save is in flight.
//
// The commit stays on the training thread, a collective at a step boundary that every rank
// reaches: at each boundary while a save is in flight the ranks ask each other whether every
// write is done (one control value each); when it is, they agree on the verdicts and rank 0
// commits (checkpoint_io.h's finish_save, the synchronous save's own code). So `latest`
// moves only to a checkpoint whose every file is durable, a kill at any moment leaves it at
// the last committed one, and a failed write (a full disk) is named at the boundary that
// finds it and ends the run as a failed synchronous save does, the previous checkpoint kept.
// The files are the bytes a synchronous save of that step writes: the same tensors, copied
// at the same boundary.
//
// With --offload the states are not copied: the writer reads them from the offload file
// (and the parameters from memory) through a bounce buffer of kCheckpointReadPiece, unit by
// unit, while the next update waits, before it rewrites a unit, until the writer has read
// that unit's old values (OffloadTier::set_before_write). The staging is then the bounce
// buffer alone, and a slow write shows as the update's wait (in the save's stall).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "core/mutex.h"
#include "memory/ledger.h"
#include "train/checkpoint_io.h"
#include "train/rank_trainer.h"
#include "train/result.h"

namespace zerodp {

// The bytes of the largest shard rank `trainer` writes: every state's own ranges, and on
// island 0's ranks the outer state with an exchange in flight.
uint64_t staging_bytes(const RankTrainer& trainer);

class AsyncSaver {
 public:
  // `stats`: the run's, counting this saver's saves too.
  AsyncSaver(RankTrainer& trainer, SaveStats& stats);
  // Waits for the writer: a save begun and not committed stays a temporary directory, which
  // the next start removes.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Whether a save is begun and not yet committed (the same on every rank).
  bool busy() const { return ticket_.has_value(); }
  // Every rank, at a step boundary: with a save in flight whose every write has finished (or,
  // `wait`, once this rank's has), agrees on it and commits it; returns its step.
  // CheckpointNotCommitted on every rank when a write failed.
  std::optional<int64_t> poll(bool wait);
  // Every rank, at the boundary where a signal stops the run: waits for the save in flight
  // at most `limit` seconds. Written in time on every rank, it is committed and its step
  // returned. Else it is abandoned: the writers stop at their next piece, the temporary is
  // removed, latest stays where it was, and stats' `abandoned` names the step.
  std::optional<int64_t> finish_on_signal(double limit);
  // Every rank, at step `step`'s boundary, nothing in flight: begins its save and hands the
  // copy to the writer. `history`: rank 0's steps up to `step`.
  void start(int64_t step, std::vector<checkpoint::StepHistory> history);

 private:
  // A save handed to the writer: what to write where.
  // One shard file: the rank's, or with --islands-in-turn each island's it holds, staged
  // one after another.
  struct Shard {
    std::filesystem::path file;
    std::vector<safetensors::TensorDecl> tensors;
    size_t begin = 0, bytes = 0;  // in the staging
  };
  struct Job {
    const SaveTicket* ticket = nullptr;  // ticket_, unchanged until the save is committed
    std::vector<Shard> shards;           // none on an HSDP replica
    std::vector<checkpoint::StepHistory> history;
    bool from_offload = false;  // read from the offload tier, not staged
  };
  void writer_loop();
  // The writer's part: the shard from staging, the history, fsynced.
  ShardWritten write(const Job& job);
  // Writer: the shard read out of the offload tier, unit by unit, into `out` (the outer
  // weights and momentum from memory, an exchange in flight from the staging).
  void write_from_offload(const Job& job, safetensors::Writer& out,
                          const std::function<void()>& check);
  // The update's thread, before it rewrites unit `u` (offloaded): until the writer has read it.
  void wait_for_unit(size_t u);
  // Training thread: the save in flight, every rank's write done, agreed and committed.
  int64_t commit(double stall_so_far);
  bool abandoning() {
    MutexLock lock(mu_);
    return abandon_;
  }

  RankTrainer& trainer_;
  Buffer<std::byte> staging_;
  std::optional<SaveTicket> ticket_;  // the save in flight (training thread)
  double stall_ = 0;                  // the training thread's time in it so far
  SaveStats& stats_;

  Mutex mu_;
  CondVar cv_;
  std::optional<Job> job_ GUARDED_BY(mu_);  // handed over, not yet taken by the writer
  bool done_ GUARDED_BY(mu_) = false;       // the save's write finished
  bool quit_ GUARDED_BY(mu_) = false;
  bool abandon_ GUARDED_BY(mu_) = false;  // stop writing at the next piece
  // Offloaded: whether the writer may still read old values, and how many units it has read.
  bool reading_ GUARDED_BY(mu_) = false;
  size_t units_read_ GUARDED_BY(mu_) = 0;
  double update_waits_ GUARDED_BY(mu_) = 0;  // the update's waits for the writer, this save
  ShardWritten written_ GUARDED_BY(mu_);
  double write_seconds_ GUARDED_BY(mu_) = 0;
  std::thread writer_;  // last: it starts once the rest exists
};

}  // namespace zerodp
