// A rank's part in checkpoints: its states written as one shard, read back by ranges from
// whichever shards hold them (any rank count, stage or precision), and the save protocol
// every rank takes part in. checkpoint/store.h has the protocol, docs/checkpoint_format.md
// the format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"
#include "core/error.h"
#include "train/model_kind.h"
#include "train/rank_trainer.h"
#include "train/result.h"

namespace zerodp {

// Everything meta.json says of this run after `step` steps, but the file checksums.
checkpoint::Meta describe_checkpoint(const RankTrainer& trainer, int64_t step);
// Writes this rank's own ranges into `file`, streamed from `store` (where the states live),
// and with `outer` the outer state's (island 0's ranks), with `pending` the exchange in
// flight too; returns its CRC-32C (hex).
std::string write_shard(const ShardedState& state, StateStore& store,
                        const std::filesystem::path& file, const OuterStep* outer = nullptr,
                        bool pending = false);
// write_shard's parts, for a save that writes from a copy (train/async_save.h): the file's
// tensors in order, its metadata, and the tensors' bytes in that order, handed to `sink`.
std::vector<safetensors::TensorDecl> shard_tensors(const ShardedState& state, bool outer,
                                                   bool pending);
std::map<std::string, std::string> shard_metadata();
void stream_shard(const ShardedState& state, StateStore& store, const OuterStep* outer,
                  bool pending, const std::function<void(std::span<const std::byte>)>& sink);
// CorruptData unless the checkpoint holds this model's units and tensors.
void check_same_model(const RankTrainer& trainer, const checkpoint::Checkpoint& ckpt);
// Replaces every state, the optimizer's counters and the data cursor with the checkpoint's.
// The caller verified the checkpoint; each rank checks the values it reads (checkpoint/
// format.h's saved_values), and one no run saves, or a read that fails, on any rank is
// CorruptData (IoError) on every rank, naming the lowest such rank's file, tensor and element.
void load_checkpoint(RankTrainer& trainer, const checkpoint::Checkpoint& ckpt);

// A resume continues the model the checkpoint in `from` holds. Its meta.json is validated
// as export validates it (CorruptData: the model its shape fields describe must have the
// units it lists); then each model field the user left out (cfg.given) is taken from it, and
// one the user gave that differs is refused (InvalidArgument naming the flag, both values
// and the file). A configuration built in code (no cfg.given) is left as it stands: its
// model is compared unit by unit when the checkpoint loads.
void adopt_checkpoint_model(TrainConfig& cfg, const std::filesystem::path& from);

// A model described somewhere other than the run's flags (a checkpoint's meta.json, a
// Hugging Face config.json) and how messages name it.
struct ModelSource {
  std::string kind;
  ShapeFields shape;
  std::string what;        // the file, e.g. "ck/step_00000010/meta.json"
  std::string flag;        // the flag that named it, e.g. "--resume"
  std::string source;      // "the checkpoint", "config.json"
  std::string key_prefix;  // before a field's name in messages: "model." or ""
  std::string remedy;      // what leaving the flag out does: "continue it"
  // A field the flags may set freely (a llama's seq_len: no weight depends on it).
  std::string free_key;
};

// The run takes `from`'s kind and every model field the user left out (cfg.given); a flag
// that differs, or that shapes another kind, is refused naming both and the file. Without
// cfg.given (a configuration built in code) nothing changes.
void adopt_model_fields(TrainConfig& cfg, const ModelSource& from);

// A save that every rank agreed was not committed: each rank throws it, at the same point,
// so the run can stop cleanly on all of them (EarlyStop::Reason::kCheckpointFailed).
class CheckpointNotCommitted : public IoError {
 public:
  using IoError::IoError;
};

// One checkpoint after `step`, every rank taking part. Nothing is committed unless every
// rank's shard is durable; a failure on any rank fails all of them with the same verdict,
// so no rank goes on while another thinks the save was lost. `history` (read on rank 0
// only) holds the steps up to `step` that the checkpoint carries.
// The checkpoint rank `comm.rank()` opens to continue from `local` (its own host's resume
// point), opened for this host: on node-local storage with --resume latest, the newest step
// every host committed (after a crash between hosts' commits they disagree on `latest`);
// elsewhere `local` itself; nothing for a fresh start (`local` empty). Every rank calls it
// (it agrees through control collectives) and verifies the whole checkpoint before any state
// exists, so a corrupt one fails every rank the same way.
std::optional<checkpoint::Checkpoint> open_resume_point(Communicator& comm, const TrainConfig& cfg,
                                                        const std::filesystem::path& local);

void save_checkpoint(RankTrainer& trainer, int64_t step,
                     const std::vector<checkpoint::StepHistory>& history);

// save_checkpoint in its three parts, so an asynchronous save (train/async_save.h) writes
// between them on another thread while the agreement and the commit stay on the training
// thread, as collectives every rank takes at the same step.
// 1. Every rank, at the step boundary: the states settled, the temporary directory created
//    by its owners and agreed, what this rank writes and the meta.json of `step` decided.
struct SaveTicket {
  int64_t step = 0;
  std::filesystem::path temp, file;  // the temporary directory, and this rank's shard in it
  std::vector<std::string> hosts;    // node-local storage: every rank's host
  bool owner = false;                // creates, commits and prunes the directory
  bool writer = false;               // writes a shard (not an HSDP replica)
  const OuterStep* outer = nullptr;  // island 0's ranks: the outer state it saves
  bool pending = false;              // an outer exchange in flight, saved too
  checkpoint::Meta meta;             // without the files' checksums
};
SaveTicket begin_save(RankTrainer& trainer, int64_t step);
// 2. This rank alone: its shard written and fsynced (rank 0: the history too).
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
// 3. Every rank: the verdicts agreed, then committed, or CheckpointNotCommitted on every
//    rank with the temporary removed. In its three parts, for the asynchronous save, whose
//    writer commits:
void finish_save(RankTrainer& trainer, const SaveTicket& ticket, const ShardWritten& written);
// 3a. Every rank: every rank's verdict, sizes and digests agreed; the meta.json to commit,
//     or CheckpointNotCommitted on every rank with the temporary removed.
checkpoint::Meta agree_save(RankTrainer& trainer, const SaveTicket& ticket,
                            const ShardWritten& written);
// 3b. The directory's owner alone, on any thread: meta.json, the rename and `latest` (and
//     --keep's pruning on shared storage). The error, or empty.
std::string commit_save(const TrainConfig& cfg, const FaultPlan& faults, const SaveTicket& ticket,
                        const checkpoint::Meta& meta);
// 3c. Every rank, once the owners' verdicts are agreed (`any_failed`): CheckpointNotCommitted
//     on every rank naming `error` (first_error's, the same on every rank), or on node-local
//     storage the owners prune, every host having committed.
void settle_commit(const TrainConfig& cfg, int64_t step, bool owner, bool any_failed,
                   const std::string& error);
// Every rank: the lowest rank's non-empty `error` (its first 1024 characters), or empty, so
// that every rank names the cause, not only the rank that met it.
std::string first_error(Communicator& comm, const std::string& error);

// A step as a checkpoint's history keeps it (what the training determines, no timings),
// and back.
checkpoint::StepHistory history_of(const StepRecord& r);
StepRecord record_of(const checkpoint::StepHistory& h);

}  // namespace zerodp
