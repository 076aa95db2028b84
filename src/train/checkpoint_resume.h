// The resume rules: what a run takes from the checkpoint it continues. Its model (before the
// options are resolved), which checkpoint every host opens, that the checkpoint is of this
// model and schedule, and then its states (through the shard mapping, checkpoint_shards.h),
// the optimizer's counters and the data cursor. docs/checkpoint_format.md has the format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include "checkpoint/format.h"
#include "checkpoint/store.h"
#include "comm/communicator.h"
#include "train/checkpoint_shards.h"
#include "train/config.h"
#include "train/model_kind.h"
#include "train/result.h"

namespace zerodp {

// CorruptData unless the checkpoint holds the units and tensors of `units`, the model `cfg`
// builds (states_meta's; each unit's counts are not compared: any rank count loads).
void check_same_model(const TrainConfig& cfg, std::span<const checkpoint::UnitMeta> units,
                      const checkpoint::Checkpoint& ckpt);
// Replaces every state `shards` holds with the checkpoint's (checkpoint_shards.h's
// load_shards) and returns the counters the run goes on with: the checkpoint's, its data
// cursor moved to `data`'s samples per step. The caller applies them. InvalidArgument when
// `cfg`'s islands or DiLoCo schedule, or `data`, differ from the checkpoint's. The caller
// verified the checkpoint; each rank checks the values it reads (checkpoint/format.h's
// saved_values), and one no run saves, or a read that fails, on any rank is CorruptData
// (IoError) on every rank of `comm`, naming the lowest such rank's file, tensor and element.
RunCounters load_checkpoint(const TrainConfig& cfg, const RankShards& shards, const RunData& data,
                            Communicator& comm, const checkpoint::Checkpoint& ckpt);

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

// Where a continuation starts, decided before any rank exists: a missing checkpoint is an
// error (InvalidArgument), never a fresh start, and a fresh start never writes over committed
// checkpoints. Empty for a fresh start.
std::filesystem::path resume_point(const TrainConfig& cfg);

// The checkpoint rank `comm.rank()` opens to continue from `local` (its own host's resume
// point), opened for this host: on node-local storage with --resume latest, the newest step
// every host committed (after a crash between hosts' commits they disagree on `latest`);
// elsewhere `local` itself; nothing for a fresh start (`local` empty). Every rank calls it
// (it agrees through control collectives) and verifies the whole checkpoint before any state
// exists, so a corrupt one fails every rank the same way.
std::optional<checkpoint::Checkpoint> open_resume_point(Communicator& comm, const TrainConfig& cfg,
                                                        const std::filesystem::path& local);

// A step as a checkpoint's history keeps it (what the training determines, no timings),
// and back.
checkpoint::StepHistory history_of(const StepRecord& r);
StepRecord record_of(const checkpoint::StepHistory& h);

}  // namespace zerodp
