// --checkpoint-async: checkpoints written beside the training instead of stalling it.
//
// At a step boundary every rank begins the save as a synchronous one does (the temporary
// directory agreed, meta.json of the step decided: train/checkpoint_save.h's begin_save),
// copies its shard's bytes, in the file's order (its RankShards, train/checkpoint_shards.h),
// into a staging buffer, and hands them to
// its writer thread, which writes and fsyncs the shard file (rank 0 the history too) while
// the steps go on. The staging buffer is allocated once, at the size of the largest shard
// this rank writes (checkpoint_staging in the memory ledger and the planner): at most one
// save is being written, and one more (the one before) being committed.
//
// The agreements stay on the training thread, collectives at a step boundary that every rank
// reaches: at each boundary while a save is in flight the ranks tell each other how far they
// are (one control value each). Once every write is done they agree on the verdicts, sizes
// and digests (checkpoint_save.h's agree_save, the synchronous save's own code), and the
// directory's owner hands the commit (meta.json, the renames and `latest`, each fsynced;
// commit_save) to its writer, which runs it before any later save's write; at a later
// boundary the ranks agree on its outcome. The commit's fsyncs were most of the training
// thread's stall where the writer kept up. So `latest` moves only to a checkpoint whose every
// file is durable, a kill at any moment leaves it at the last committed one, and a failed
// write or commit (a full disk) is named at the boundary that finds it and ends the run as a
// failed synchronous save does, the previous checkpoint kept. The files are the bytes a
// synchronous save of that step writes: the same tensors, copied at the same boundary.
//
// With --offload the states are not copied: the writer reads them from the offload file
// (and the parameters from memory) through a bounce buffer of kCheckpointReadPiece, unit by
// unit, while the next update waits, before it rewrites a unit, until the writer has read
// that unit's old values (OffloadTier::set_before_write). The staging is then the bounce
// buffer and what the next step rewrites without that wait (ShardTensor::copy_at_boundary),
// and a slow write shows as the update's wait (in the save's stall).
//
// The run's last save and the one after a signal are synchronous (SyncSaver's): the run ends
// with them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "core/mutex.h"
#include "memory/ledger.h"
#include "train/checkpoint_save.h"
#include "train/checkpoint_shards.h"
#include "train/offload.h"
#include "train/result.h"

namespace zerodp {

class RankTrainer;

// The saver the run's options ask for: none without --checkpoint-dir, an AsyncSaver with
// --checkpoint-async, else a SyncSaver. `stats`: the run's, counting every save.
std::unique_ptr<Saver> make_saver(RankTrainer& trainer, SaveStats& stats);

class AsyncSaver final : public Saver {
 public:
  // `stats`: the run's, counting this saver's saves too. The staging (`staging` bytes) is on
  // `ledger`; `offload`: the tier the states are in, or null.
  AsyncSaver(SaveParty party, SaveStats& stats, MemoryLedger& ledger, uint64_t staging,
             OffloadTier* offload);
  // Waits for the writer: a save begun and not committed stays a temporary directory, which
  // the next start removes.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // A due save starts in the background once the staging is free (the last save written
  // everywhere and its commit handed to the writer, which runs it first), waited for unless
  // --checkpoint-busy skip skips it; the save in flight is committed once every rank's write
  // is done. The run's end waits for every commit; its last save is synchronous, and after a
  // signal the save in flight gets --checkpoint-signal-wait before the signal's own.
  std::optional<int64_t> at_boundary(const SaveBoundary& b) override;
  void save_now(int64_t step, const std::vector<checkpoint::StepHistory>& history) override {
    sync_.save_now(step, history);
  }

 private:
  // Whether a save is begun and not yet committed (the same on every rank).
  bool busy() const { return ticket_.has_value() || committing_.has_value(); }
  // Whether a save's files are still being written: the staging is taken until they are.
  bool writing() const { return ticket_.has_value(); }
  // How long poll goes on: one look; until the save being written is written everywhere and
  // handed on to its commit, which frees the staging for the next save (its commit then runs
  // on the writer ahead of that save's write, and a later boundary agrees on it); or until
  // nothing is in flight.
  enum class Wait { kNo, kForStaging, kForAll };
  // Every rank, at a step boundary: a save whose every write has finished is agreed and
  // handed to the owner's writer to commit; a commit every owner has finished is agreed.
  // Returns the step committed here, if any. CheckpointNotCommitted on every rank when a
  // write or a commit failed.
  std::optional<int64_t> poll(Wait wait);
  // Every rank, at the boundary where a signal stops the run: waits for the save in flight
  // at most `limit` seconds. Written in time on every rank, it is committed and its step
  // returned. Else it is abandoned: the writers stop at their next piece, the temporary is
  // removed, latest stays where it was (or moves to the save before, already agreed), and
  // stats' `abandoned` names the step.
  std::optional<int64_t> finish_on_signal(double limit);
  // Every rank, at step `step`'s boundary, no save being written: begins its save and hands
  // the copy to the writer. `history`: rank 0's steps up to `step`.
  void start(int64_t step, std::vector<checkpoint::StepHistory> history);

  // A save handed to the writer: what to write where.
  // One shard file: the rank's, or with --islands-in-turn each island's it holds, staged
  // one after another.
  struct Shard {
    std::filesystem::path file;
    std::vector<safetensors::TensorDecl> tensors;
    size_t begin = 0, bytes = 0;       // in the staging
    std::vector<ShardTensor> sources;  // offloaded: where the writer reads each tensor
  };
  // The shards' bytes copied into the staging, each island's with its states active.
  std::vector<Shard> stage(const SaveTicket& ticket, const RankShards& shards);
  // Offloaded: the one shard to read out of the tier, what the writer cannot wait for staged.
  Shard from_offload(const SaveTicket& ticket, const RankShards& shards);
  struct Job {
    const SaveTicket* ticket = nullptr;  // ticket_, unchanged until the save is agreed
    std::vector<Shard> shards;           // none on an HSDP replica
    std::vector<checkpoint::StepHistory> history;
    bool from_offload = false;  // read from the offload tier, not staged
  };
  // A save agreed by every rank, its commit handed to the owner's writer.
  struct CommitJob {
    SaveTicket ticket;
    checkpoint::Meta meta;
  };
  // What a rank has in flight at a boundary, summed over the ranks in one control value.
  struct Progress {
    int64_t unwritten = 0;    // ranks whose write is not done
    int64_t uncommitted = 0;  // owners whose commit is not done
    int64_t failed = 0;       // owners whose commit failed
    int64_t stopping = 0;     // ranks that saw a stop request while waiting for the staging
  };
  Progress exchange(const Progress& mine);
  void writer_loop();
  // The writer's part: the shard from staging, the history, fsynced.
  ShardWritten write(const Job& job);
  // Writer: the shard read out of the offload tier, unit by unit, into `out` (what memory
  // holds from memory, what was copied at the boundary from the staging).
  void write_from_offload(const Shard& shard, safetensors::Writer& out,
                          const std::function<void()>& check);
  // The update's thread, before it rewrites unit `u` (offloaded): until the writer has read it.
  void wait_for_unit(size_t u);
  // Training thread: the save in flight, every rank's write done, agreed and its commit
  // handed to the owner's writer.
  void hand_over_commit();
  // Training thread: the commit every owner has finished, its outcome agreed.
  int64_t settle(bool any_failed);
  // This rank's part of what is in flight is done.
  bool own_part_done() REQUIRES(mu_) {
    return (!ticket_ || done_) && (!committing_ || !committing_->owner || committed_);
  }
  bool abandoning() {
    MutexLock lock(mu_);
    return abandon_;
  }

  SaveParty party_;
  OffloadTier* offload_;
  SyncSaver sync_;  // the saves the run ends with
  Buffer<std::byte> staging_;
  std::optional<SaveTicket> ticket_;  // the save being written (training thread)
  // The save agreed and being committed (training thread): its ticket moved to the writer.
  struct Committing {
    int64_t step = 0;
    bool owner = false;  // its writer commits it
    double stall = 0;    // the training thread's time in this save so far
  };
  std::optional<Committing> committing_;
  // The save being written's stall: the training thread's time in its copy, in the
  // boundaries that waited for or checked on its write, and the update's waits for the writer.
  double stall_ = 0;
  // Time at a boundary goes to the save being written, else to the one being committed.
  void charge(double seconds) {
    if (ticket_ || !committing_) {
      stall_ += seconds;
    } else {
      committing_->stall += seconds;
    }
  }
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
  double write_cpu_seconds_ GUARDED_BY(mu_) = 0;
  std::optional<CommitJob> commit_job_ GUARDED_BY(mu_);  // handed over, not yet taken
  bool committed_ GUARDED_BY(mu_) = false;               // the commit handed over is done
  std::string commit_error_ GUARDED_BY(mu_);
  double commit_seconds_ GUARDED_BY(mu_) = 0;
  double commit_cpu_seconds_ GUARDED_BY(mu_) = 0;
  std::thread writer_;  // last: it starts once the rest exists
};

}  // namespace zerodp
