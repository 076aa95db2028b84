// The save protocol every rank takes part in, and the savers a run saves through.
// checkpoint/store.h has the directory's protocol, docs/checkpoint_format.md the format.
//
// One checkpoint after a step: the temporary directory created by its owners and agreed
// (begin_save), every rank's shards written and fsynced (write_shards), every rank's verdict,
// sizes and digests agreed (agree_save), then meta.json, the renames and `latest` by the
// owners (commit_save) and their outcome agreed (settle_commit). Nothing is committed unless
// every rank's shard is durable; a failure on any rank fails all of them with the same
// verdict, so no rank goes on while another thinks the save was lost. The parts stay apart so
// that an asynchronous save (train/async_save.h) writes and commits on its writer thread
// while the agreements stay collectives on the training thread, at the same step on every
// rank.
//
// A run saves through one Saver: SyncSaver, or AsyncSaver (--checkpoint-async) behind the
// same interface, so the step loop asks at each boundary and never picks between them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/store.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "train/checkpoint_shards.h"
#include "train/config.h"
#include "train/fault_plan.h"
#include "train/result.h"
#include "train/trace.h"

namespace zerodp {

// A save that every rank agreed was not committed: each rank throws it, at the same point,
// so the run can stop cleanly on all of them (EarlyStop::Reason::kCheckpointFailed).
class CheckpointNotCommitted : public IoError {
 public:
  using IoError::IoError;
};

// The run's side of a save: the ranks taking part and the options and hooks they save with.
struct SaveParty {
  Communicator* comm = nullptr;  // the world
  const TrainConfig* cfg = nullptr;
  const FaultPlan* faults = nullptr;
  Tracer* tracer = nullptr;  // null: not traced
  int files_per_rank = 1;    // the shard files each rank names in the agreement
  // What a save of a step writes, decided at its boundary (train/checkpoint_shards.h's
  // save_content).
  std::function<SaveContent(int64_t step)> content;
};

// 1. Every rank, at the step boundary: the temporary directory created by its owners and
//    agreed; `meta` is the step's meta.json without the files' checksums.
struct SaveTicket {
  int64_t step = 0;
  std::filesystem::path temp;      // the temporary directory
  std::vector<std::string> hosts;  // node-local storage: every rank's host
  bool owner = false;              // creates, commits and prunes the directory
  checkpoint::Meta meta;
  // Shard `index`'s path in the temporary (RankShards::Island::file).
  std::filesystem::path file(int index) const;
};
SaveTicket begin_save(const SaveParty& party, int64_t step, checkpoint::Meta meta);
// 2. This rank alone: its shards written and fsynced (rank 0: the history too).
struct ShardWritten {
  // The shards this rank wrote: one, or with --islands-in-turn one per island it holds (in
  // island order); none under HSDP's replicas.
  struct File {
    std::string crc32c;  // hex
    uint64_t bytes = 0;
  };
  std::vector<File> files;
  checkpoint::FileMeta history;  // rank 0's
  std::string error;             // empty: written
};
// The synchronous write of `shards` into the ticket's directory, each island's shard with its
// states active; a failure is the result's error.
ShardWritten write_shards(const SaveParty& party, const SaveTicket& ticket,
                          const RankShards& shards,
                          const std::vector<checkpoint::StepHistory>& history);
// 3. Every rank: the verdicts agreed, then committed, or CheckpointNotCommitted on every
//    rank with the temporary removed. In its three parts, for the asynchronous save, whose
//    writer commits:
void finish_save(const SaveParty& party, const SaveTicket& ticket, const ShardWritten& written);
// 3a. Every rank: every rank's verdict, sizes and digests agreed; the meta.json to commit,
//     or CheckpointNotCommitted on every rank with the temporary removed.
checkpoint::Meta agree_save(const SaveParty& party, const SaveTicket& ticket,
                            const ShardWritten& written);
// 3b. The directory's owner alone, on any thread: meta.json, the rename and `latest` (and
//     --keep's pruning on shared storage). The error, or empty.
std::string commit_save(const SaveParty& party, const SaveTicket& ticket,
                        const checkpoint::Meta& meta);
// 3c. Every rank, once the owners' verdicts are agreed (`any_failed`): CheckpointNotCommitted
//     on every rank naming `error` (first_error's, the same on every rank), or on node-local
//     storage the owners prune, every host having committed.
void settle_commit(const TrainConfig& cfg, int64_t step, bool owner, bool any_failed,
                   const std::string& error);
// Every rank: the lowest rank's non-empty `error` (its first 1024 characters), or empty, so
// that every rank names the cause, not only the rank that met it.
std::string first_error(Communicator& comm, const std::string& error);

// One checkpoint after `step`, all three parts, every rank taking part. `history` (read on
// rank 0 only) holds the steps up to `step` that the checkpoint carries.
void save_checkpoint(const SaveParty& party, int64_t step,
                     const std::vector<checkpoint::StepHistory>& history);

// A step boundary as a saver sees it.
struct SaveBoundary {
  int64_t step = 0;
  bool due = false;          // --checkpoint-every asks for a save here
  bool last = false;         // the run's last step
  bool interrupted = false;  // a signal stops the run here
  bool stopping = false;     // the run stops here for any reason
  // Rank 0's steps up to `step`, which a checkpoint carries.
  const std::vector<checkpoint::StepHistory>* history = nullptr;
};

// How a run saves. Every rank calls the same methods at the same steps.
class Saver {
 public:
  virtual ~Saver() = default;
  // At every step boundary: the save due there, and whatever the saver has in flight. The
  // run's last save and the one after a signal are synchronous: the run ends with them.
  // Returns the step of the checkpoint committed here, if any; CheckpointNotCommitted on
  // every rank when one failed.
  virtual std::optional<int64_t> at_boundary(const SaveBoundary& b) = 0;
  // A synchronous save of `step` now, outside the schedule (a continuation with nothing left
  // to train re-saves where it stands: how a checkpoint is resharded).
  virtual void save_now(int64_t step, const std::vector<checkpoint::StepHistory>& history) = 0;
};

// Every save written at its boundary: the training waits for it. `stats`: the run's.
class SyncSaver final : public Saver {
 public:
  SyncSaver(SaveParty party, SaveStats& stats) : party_(std::move(party)), stats_(stats) {}
  std::optional<int64_t> at_boundary(const SaveBoundary& b) override;
  void save_now(int64_t step, const std::vector<checkpoint::StepHistory>& history) override {
    save_checkpoint(party_, step, history);
  }

 private:
  SaveParty party_;
  SaveStats& stats_;
};

}  // namespace zerodp
