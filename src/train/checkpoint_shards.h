// The shard mapping: what a rank's checkpoint shards hold and where in its states each
// tensor's bytes are, written and read back. docs/checkpoint_format.md has the format.
//
// A save is handed a RankShards, built from the trainer once per save (rank_shards): per
// island the rank holds, the shard file it writes and, in the file's order, each tensor's
// declaration and source, a StateStore array over the unit's own range (memory or the offload
// file alike) or bytes in memory. Writers (the synchronous save, the asynchronous saver's
// copy or its reads from the offload file) walk that list and know no state kind: a new kind
// of state is new entries in rank_shards (and, read back, a rule in load_shards), not a new
// branch in each writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/store.h"
#include "core/partition.h"
#include "data/sampler.h"
#include "train/config.h"
#include "train/held_islands.h"
#include "train/optimizer_step.h"
#include "train/outer_step.h"
#include "train/sharded_state.h"
#include "train/state_store.h"

namespace zerodp {

class RankTrainer;

using ByteSink = std::function<void(std::span<const std::byte>)>;

// One tensor of a shard file and where its bytes come from.
struct ShardTensor {
  safetensors::TensorDecl decl;
  size_t unit = 0;
  // From the store: one StateStore::Arrays bit over `range` of the unit's optimizer range
  // (the own range). 0: from memory, `bytes`.
  unsigned array = 0;
  Range range;
  // From memory: the tensor's bytes handed to the sink in order, read when it is written.
  std::function<void(const ByteSink&)> bytes;
  // Memory the next step rewrites without waiting for a writer still reading it (an outer
  // exchange in flight): a save written after its boundary copies it there.
  bool copy_at_boundary = false;
  uint64_t byte_count() const;
};

// What a rank writes into a checkpoint and reads back from one.
struct RankShards {
  // One island this rank holds.
  struct Island {
    int file = 0;   // the shard it writes, rank_file_name(file): island v of rank r, v N + r
    int saved = 0;  // the checkpoint's island whose shards it reads back
    std::vector<ShardTensor> tensors;  // its file's, in order
  };
  HeldIslands* islands = nullptr;  // the states, each island active while written or read
  std::vector<Island> held;        // one per island of `islands`
  bool writer = false;             // writes shards: not an HSDP replica
  OuterStep* outer = nullptr;      // --islands: the outer state every rank reads back
};

// What a save of one step writes: meta.json (without the files' checksums) and the shards.
struct SaveContent {
  checkpoint::Meta meta;
  RankShards shards;
};

// The states a checkpoint holds as meta.json records them: the model's units (each one's
// name, size and tensors), each unit's split over the `world` ranks that write shards, and
// the moments' precision. A resume compares its own units with the saved ones.
struct StatesMeta {
  int world = 0;
  bool int8_moments = false;
  std::vector<checkpoint::UnitMeta> units;
};
StatesMeta states_meta(const ShardedState& state, int world);

// What a checkpoint carries of a run's progress to the run that continues it.
struct RunCounters {
  OptimizerCounters optimizer;
  SamplerPosition data;             // the next step's place in the epoch order
  std::string samples_chain;        // hex, as RankTrainer::samples_chain
  uint64_t samples_chain_from = 0;  // the step the chain started after
  // The rate the next step applies: recorded for readers, never restored (a continuation's
  // schedule gives it).
  double lr_next = 0;
};

// The data a run reads, as a checkpoint records it and a resume compares it.
struct RunData {
  std::string identity;  // DataSplits::identity
  uint64_t samples_per_step = 0;
  uint64_t dataset_size = 0;
  uint64_t steps_per_epoch = 0;
};

// The trainer's shards. With --islands, island 0's ranks' shards hold the outer state, and
// with `pending` the outer exchange in flight too.
RankShards rank_shards(RankTrainer& trainer, bool pending);
// The trainer's data, and its counters after `step` steps.
RunData run_data(const RankTrainer& trainer);
RunCounters run_counters(const RankTrainer& trainer, int64_t step);
// Everything meta.json says of a run after `step` steps, but the file checksums.
checkpoint::Meta describe_checkpoint(const TrainConfig& cfg, const StatesMeta& states,
                                     const RunData& data, const RunCounters& counters,
                                     int64_t step);
// A save of `step` at its boundary: the states settled, an outer exchange in flight waited
// for, what it writes decided. The one place a save reads the trainer.
SaveContent save_content(RankTrainer& trainer, int64_t step);

std::vector<safetensors::TensorDecl> shard_decls(std::span<const ShardTensor> tensors);
std::map<std::string, std::string> shard_metadata();
// The tensors' bytes in order, the store's streamed one unit's run at a time.
void stream_shard(std::span<const ShardTensor> tensors, StateStore& store, const ByteSink& sink);
// The shard written into `file` (O_DIRECT where the file system takes it); its CRC-32C (hex).
std::string write_shard(std::span<const ShardTensor> tensors, StateStore& store,
                        const std::filesystem::path& file);

// Every state of `shards` from the checkpoint, each island's from its saved island's shards,
// by the ranges this rank holds (any rank count, stage, precision or moment precision).
// CorruptData / IoError as checkpoint::Checkpoint's reads.
void load_shards(const RankShards& shards, const checkpoint::Checkpoint& ckpt);

}  // namespace zerodp
