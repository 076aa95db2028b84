// A checkpoint's description: meta.json, field by field (docs/checkpoint_format.md).
//
// A checkpoint is a directory per step holding meta.json and one safetensors file per rank.
// Rank r of N saves, for every unit, its own range of the unit's flat buffer under the
// unit's Partition(numel, N): "<unit>.params" in the run's dtype, and at 16-bit precisions
// "<unit>.master"; then "<unit>.adam_m" and "<unit>.adam_v" (fp32). At stage 0 every rank
// holds everything but still saves only its own range, so no byte is written twice and a
// checkpoint has one layout at every stage: stage and N change how it is read, not what it
// holds. meta.json records what a continuation needs beyond the tensors and a digest per
// file, and is written last: a directory with a valid meta.json is complete. Beside the
// shards, history.jsonl keeps the steps that led here (what a report shows, not state).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/safetensors.h"

namespace zerodp::checkpoint {

inline constexpr std::string_view kFormat = "zerodp-checkpoint-1";
// The loss history beside the shards, written by rank 0 and listed in meta.json's files
// after the rank files. Checkpoints of earlier versions have none.
inline constexpr std::string_view kHistoryFile = "history.jsonl";
// The 8-bit moment code of a meta.json without optimizer.moment_code (Meta::moment_code).
inline constexpr std::string_view kMomentCodeBeforeTheField = "decades";

struct TensorMeta {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // first element within the unit's flat buffer
  uint64_t numel = 0;
  bool operator==(const TensorMeta&) const = default;
};

struct UnitMeta {
  std::string name;
  uint64_t numel = 0;
  std::vector<TensorMeta> tensors;
  std::vector<uint64_t> counts;  // the saved partition: rank r's elements, in rank order
  bool operator==(const UnitMeta&) const = default;
};

struct FileMeta {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  // The file's digest, lowercase hex: CRC-32C (8 digits; core/crc32c.h) in checkpoints
  // written since it replaced SHA-256, SHA-256 (64) in those from before. Exactly one is set:
  // parse_meta refuses an entry with both, which the reader would check only one of.
  std::string crc32c;
  std::string sha256;
};

struct ScalerMeta {
  double scale = 0;
  int64_t clean_steps = 0;
  int32_t hysteresis_left = 1;
};

// One optimizer step as the history keeps it: only what is a pure function of the training
// (never wall time or MFU), so a checkpoint's bytes stay one.
struct StepHistory {
  int64_t step = 0;  // 1-based
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double grad_norm_clipped = 0;
  std::optional<double> loss_scale;  // fp16 only
  bool skipped = false;
  uint64_t tokens = 0;
  std::optional<double> val_loss;  // when evaluated after this step
  bool outer = false;              // DiLoCo's outer step ended it (written only when true)
};

struct Meta {
  std::string zerodp_version;
  uint64_t step = 0;  // optimizer steps completed; a continuation runs step + 1 next
  int world_size = 0;
  // DiLoCo (train --islands): every island's ranks wrote a shard of its own states, world_size
  // per island (rank files island * world_size + r), and island 0's files also hold the outer
  // state ("<unit>.outer_params", "<unit>.outer_momentum"). 1 = no islands (not written).
  int islands = 1;
  int stage = 0;
  std::string precision;  // "bf16" | "fp16" | "fp32": the dtype of "<unit>.params"
  // The model: its kind and shape fields (gpt: layers, heads, embd, seq_len, vocab; mlp:
  // hidden, hidden_layers), and its units, which a loader compares with its own.
  std::string model_kind;
  std::map<std::string, int64_t> model_shape;
  std::vector<UnitMeta> units;
  // Every resolved option of the run that saved it, as strings, so a continuation can say
  // which of its flags differ.
  std::map<std::string, std::string> config;
  // Optimizer and schedule.
  int64_t adam_step = 0;  // AdamW's counter: applied steps (skipped ones do not count)
  // --optimizer-states int8: each shard holds, per unit, "adam_m8"/"adam_v8" (one code byte
  // per element of its range; 0 for elements of fp32-moment tensors), "adam_m8_scale"/
  // "adam_v8_scale" (fp32, one per block of the range, in order) and "adam_m"/"adam_v"
  // (fp32, only the range's elements of tensors whose moments stay fp32). Written in
  // meta.json as optimizer.moments "int8"; absent: fp32.
  bool int8_moments = false;
  // int8: the code the bytes are in (optim/moments8.h's names), meta.json's
  // optimizer.moment_code; "decades" when absent, the code of the checkpoints written before
  // the field existed. The loader refuses a name it does not know.
  std::string moment_code;
  double lr_next = 0;                     // informational: the learning rate of step + 1 as saved
  std::optional<ScalerMeta> loss_scaler;  // fp16 only
  // Data: the sampler's cursor and what it means.
  uint64_t data_epoch = 0;
  uint64_t data_step = 0;         // optimizer steps already taken in data_epoch
  uint64_t samples_per_step = 0;  // K = N * b * A
  uint64_t dataset_size = 0;
  uint64_t seed = 0;
  // The samples every step so far read, chained (hex sha256; data.samples_chain): empty in
  // checkpoints from before it was kept, when a resume starts a new chain at its step.
  // What identifies the data set beyond its size (data.identity): a token shard set's
  // digest; empty for the in-memory sources. A resume on other data is refused.
  std::string data_identity;
  std::string samples_chain;
  uint64_t samples_chain_from = 0;  // the step the chain starts after (0: the run's start)
  // Random state per rank. zerodp has none that advances: initialization and data order are
  // pure functions of (seed, ...), so each rank's entry records the seed and the counter
  // (the data position) they are keyed by.
  std::vector<uint64_t> rank_seeds;
  // The rank files in rank order, then kHistoryFile when the checkpoint has a history.
  std::vector<FileMeta> files;
  // Node-local storage (train --checkpoint-storage node-local): the host that wrote each
  // rank file (its only copy) and, last, the history; empty for a checkpoint on storage every
  // host shares. A reader on another host can say where a shard it cannot see lives.
  std::vector<std::string> hosts;
  int shard_files() const { return world_size * islands; }
  bool has_history() const { return files.size() > static_cast<size_t>(shard_files()); }
};

std::string step_dir_name(uint64_t step);  // "step_00000012"
std::string rank_file_name(int rank);      // "rank_00000.safetensors"
// Tensor names in a rank file.
std::string tensor_name(std::string_view unit, std::string_view kind);  // "h.0" + "master"

// What a run saves in a tensor of `kind` ("params", "adam_v", "adam_v8_scale", ...): finite
// values, and for the second moments and the 8-bit scales (block maxima) finite values that
// are not negative (-0 is zero); 8-bit codes are any bytes. A step whose gradients are not
// finite is skipped, never applied, so a saved state outside these is damage, whatever its
// checksums say.
enum class SavedValues : uint8_t { kAny, kFinite, kFiniteNonNegative };
SavedValues saved_values(std::string_view kind);
std::string_view describe(SavedValues rule);  // "finite", "finite, non-negative"
// The first element of `bytes` (little-endian elements of `type`; F32, BF16 and F16 are
// checked, other types pass) that `rule` refuses: its index and its value, widened. Blocks of
// 512 are tested without a branch per element, which the compiler vectorizes: 25-30 GB/s on
// the development machine, at most half the time of the read it follows.
struct BadValue {
  uint64_t index = 0;
  double value = 0;
};
std::optional<BadValue> first_bad_value(std::span<const std::byte> bytes,
                                        safetensors::ElementType type, SavedValues rule);

// meta.json text (pretty-printed, keys in a fixed order).
std::string to_json(const Meta& meta);
// Throws CorruptData naming `what` (the file) and the field when the text is not a
// meta.json of this format: bad JSON, a missing or mistyped field, partitions that do not
// sum to their unit, a rank count that disagrees with the files, or a unit whose tensors do
// not describe it: a numel that is not its shape's product, or tensors that do not lie back
// to back from offset 0 to the unit's numel (the layout every model's units have).
Meta parse_meta(std::string_view text, std::string_view what);

// history.jsonl text: one JSON object per line, per step in order (step, loss, lr,
// grad_norm, grad_norm_clipped, loss_scale, skipped, tokens, and val_loss when evaluated).
// A non-finite number is written null and read back as NaN.
std::string history_to_jsonl(const std::vector<StepHistory>& steps);
// Throws CorruptData naming `what` and the line unless every line is such an object and the
// steps are consecutive, ending at `last_step` (the checkpoint's step) when there are any.
std::vector<StepHistory> parse_history(std::string_view text, std::string_view what,
                                       uint64_t last_step);

// Throws CorruptData unless the checkpoint file `path` (symlinks followed) is a regular
// file: a FIFO would block its first read forever, a device (a link to /dev/zero) never
// ends, a directory cannot be read. `role` names it ("checkpoint shard", "checkpoint
// meta.json"). A path where nothing is is left to the caller, who knows what was expected.
void require_regular_file(const std::filesystem::path& path, std::string_view role);

}  // namespace zerodp::checkpoint
